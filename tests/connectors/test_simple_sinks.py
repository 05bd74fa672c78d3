from __future__ import annotations

import pickle

import pytest

from epochstream.connectors.base import SinkContext
from epochstream.connectors.simple import DiscardSink, PrintSink


def ctx(subtask: int = 0, parallelism: int = 1) -> SinkContext:
    return SinkContext(subtask, parallelism, attempt=0, job_id="job", checkpointing=True)


@pytest.mark.parametrize(
    "prefix,subtask,parallelism,expected",
    [
        (None, 0, 1, "1\n('a', 2)\n"),
        (None, 2, 3, "2> 1\n2> ('a', 2)\n"),
        ("out", 0, 1, "out> 1\nout> ('a', 2)\n"),
        ("out", 1, 4, "out:1> 1\nout:1> ('a', 2)\n"),
    ],
)
def test_print_sink_prefixes(
    capsys: pytest.CaptureFixture[str],
    prefix: str | None,
    subtask: int,
    parallelism: int,
    expected: str,
) -> None:
    sink = PrintSink(prefix)
    assert sink.transactional is False
    w = sink.create_writer(ctx(subtask, parallelism))
    w.restore([])
    w.write_batch([1, ("a", 2)])
    w.write_batch([])
    assert w.snapshot(1) == []
    w.notify_checkpoint_complete(1)
    w.end_input()
    w.close()
    assert capsys.readouterr().out == expected


def test_print_sink_flushes_each_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    class Recorder:
        def __init__(self) -> None:
            self.events: list[str] = []

        def write(self, text: str) -> int:
            self.events.append(f"write:{text!r}")
            return len(text)

        def flush(self) -> None:
            self.events.append("flush")

    recorder = Recorder()
    monkeypatch.setattr("sys.stdout", recorder)
    w = PrintSink().create_writer(ctx())
    w.write_batch(["a", "b"])
    w.write_batch(["c"])
    assert recorder.events == ["write:'a\\nb\\n'", "flush", "write:'c\\n'", "flush"]


def test_discard_sink_counts_records_over_its_writers() -> None:
    sink = DiscardSink()
    assert sink.transactional is False
    w0, w1 = sink.create_writer(ctx(0, 2)), sink.create_writer(ctx(1, 2))
    w0.write_batch(list(range(5)))
    w1.write_batch(["x"])
    w1.write_batch([])
    assert (w0.count, w1.count, sink.count) == (5, 1, 6)
    assert w0.snapshot(1) == []
    shipped = pickle.loads(pickle.dumps(sink))
    assert shipped.count == 0
    shipped.create_writer(ctx()).write_batch([1, 2])
    assert (shipped.count, sink.count) == (2, 6)
