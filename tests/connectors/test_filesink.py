from __future__ import annotations

import csv
import json
import logging
import pickle
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from epochstream.connectors.base import SinkContext, SourceContext
from epochstream.connectors.files import TextFileSplit
from epochstream.connectors.filesink import FileCommittable, FileSink, FileSinkWriter, RollingPolicy
from epochstream.connectors.formats import TextFileSource
from epochstream.core.clock import ManualClock
from epochstream.exceptions import ConfigurationError, SinkError

JOB = "0123456789abcdef"


def ctx(
    subtask: int = 0,
    parallelism: int = 1,
    attempt: int = 0,
    job_id: str = JOB,
    checkpointing: bool = True,
) -> SinkContext:
    return SinkContext(subtask, parallelism, attempt, job_id, checkpointing)


def writer(out: Path, **kwargs: Any) -> FileSinkWriter:
    roll = kwargs.pop("roll_records", None)
    return FileSink(out, roll_records=roll).create_writer(ctx(**kwargs))


def visible(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if not p.name.startswith((".", "_")))


def hidden(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith("."))


def committed_records(out: Path) -> list[Any]:
    records: list[Any] = []
    for name in visible(out):
        assert name.endswith(".jsonl")
        records.extend(json.loads(line) for line in (out / name).read_text().splitlines())
    return records


def test_precommit_hides_and_commit_publishes(tmp_path: Path) -> None:
    out = tmp_path / "out" / "nested"  # created on demand
    w = writer(out)
    w.restore([])
    w.write_batch([{"word": "a", "n": 1}, ("b", 2), [3], "s", 4.5, None])
    assert visible(out) == []
    assert hidden(out) == [".part-0-01234567-a0-000001.jsonl.inprogress"]
    entries = w.snapshot(1)
    assert entries == [
        FileCommittable(
            ".part-0-01234567-a0-000001.jsonl.pending",
            "part-0-01234567-a0-000001.jsonl",
            directory=str(out),
        )
    ]
    assert pickle.loads(pickle.dumps(entries)) == entries
    assert visible(out) == []
    assert hidden(out) == [".part-0-01234567-a0-000001.jsonl.pending"]
    w.notify_checkpoint_complete(1)
    assert hidden(out) == []
    assert visible(out) == ["part-0-01234567-a0-000001.jsonl"]
    text = (out / "part-0-01234567-a0-000001.jsonl").read_text()
    assert text == '{"word": "a", "n": 1}\n["b", 2]\n[3]\n"s"\n4.5\nnull\n'
    w.close()


def test_empty_transactions_create_no_file(tmp_path: Path) -> None:
    w = writer(tmp_path)
    w.restore([])
    w.write_batch([])
    assert w.snapshot(1) == []
    w.notify_checkpoint_complete(1)
    w.end_input()
    w.close()
    assert list(tmp_path.iterdir()) == []


def test_names_are_unique_across_subtasks_checkpoints_attempts_and_jobs(tmp_path: Path) -> None:
    for job in ("aaaaaaaa-job", "bbbbbbbb-job"):
        for attempt in range(2):
            for subtask in range(2):
                w = writer(tmp_path, subtask=subtask, parallelism=2, attempt=attempt, job_id=job)
                w.restore([])
                for cid in (1, 2):
                    w.write_batch([cid])
                    w.snapshot(cid)
                    w.notify_checkpoint_complete(cid)
                w.close()
    names = set(visible(tmp_path))
    assert len(names) == 2 * 2 * 2 * 2
    assert sorted(committed_records(tmp_path)) == [1] * 8 + [2] * 8


def test_commit_is_idempotent(tmp_path: Path) -> None:
    w = writer(tmp_path)
    w.restore([])
    w.write_batch(["x"])
    (entry,) = w.snapshot(1)
    w.notify_checkpoint_complete(1)
    assert visible(tmp_path) == [entry.final]
    # A restore from checkpoint 1 commits the same entry again: nothing changes.
    w2 = writer(tmp_path, attempt=1)
    w2.restore([entry])
    assert visible(tmp_path) == [entry.final]
    assert committed_records(tmp_path) == ["x"]
    w2._commit_entry(entry)
    assert committed_records(tmp_path) == ["x"]


def test_commit_of_vanished_files_names_files_and_place(tmp_path: Path) -> None:
    w = writer(tmp_path)
    lost = FileCommittable(".part-0-x-a0-000009.jsonl.pending", "part-0-x-a0-000009.jsonl")
    with pytest.raises(SinkError) as info:
        w.restore([lost])
    message = str(info.value)
    assert lost.pending in message and lost.final in message and str(tmp_path) in message
    assert info.value.suppress_restarts, "a restart cannot bring the file back"


def _pending_in(directory: Path, records: list[Any]) -> FileCommittable:
    """Write records and pre-commit them in ``directory``, as a crashed job would leave them."""
    w = writer(directory)
    w.restore([])
    w.write_batch(records)
    (entry,) = w.snapshot(1)
    return entry


def test_sink_moved_commits_pending_output_where_it_was_written(tmp_path: Path) -> None:
    """Restored with the sink pointing elsewhere: the checkpoint's output is committed in
    the old directory (its records are covered by the checkpoint), new output goes to the new."""
    old, new = tmp_path / "old", tmp_path / "new"
    entry = _pending_in(old, ["covered"])
    w = writer(new, attempt=1)
    w.restore([entry])
    assert committed_records(old) == ["covered"] and hidden(old) == []
    w.write_batch(["fresh"])
    w.snapshot(2)
    w.notify_checkpoint_complete(2)
    assert committed_records(new) == ["fresh"]


def test_sink_directory_moved_with_its_files_commits_in_the_new_place(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    entry = _pending_in(old, ["covered"])
    old.rename(new)
    w = writer(new, attempt=1)
    w.restore([entry])
    assert committed_records(new) == ["covered"]


def test_sink_moved_and_pending_file_gone_fails_naming_both(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    entry = _pending_in(old, ["covered"])
    (old / entry.pending).unlink()
    with pytest.raises(SinkError) as info:
        writer(new, attempt=1).restore([entry])
    assert str(old) in str(info.value) and str(new) in str(info.value)
    assert info.value.suppress_restarts


def test_aborted_checkpoint_leaves_nothing_visible(tmp_path: Path) -> None:
    w = writer(tmp_path)
    w.restore([])
    w.write_batch(["a", "b"])
    w.snapshot(1)
    w.notify_checkpoint_aborted(1)
    assert visible(tmp_path) == []
    # The job fails now; on restart from no checkpoint, the leftovers are removed.
    w.write_batch(["c"])
    w.close()
    assert visible(tmp_path) == []
    restarted = writer(tmp_path, attempt=1)
    restarted.restore([])
    assert list(tmp_path.iterdir()) == []


def test_restore_commits_pending_and_removes_leftovers(tmp_path: Path) -> None:
    # Attempt 0, two subtasks: checkpoint 1 completes but the job fails before notify;
    # checkpoint 2's files were pre-committed but checkpoint 2 never completed.
    writers = [writer(tmp_path, subtask=i, parallelism=2) for i in range(2)]
    checkpoint1: list[Any] = []
    for i, w in enumerate(writers):
        w.restore([])
        w.write_batch([f"c1-s{i}"])
        checkpoint1.extend(w.snapshot(1))
    for i, w in enumerate(writers):
        w.write_batch([f"c2-s{i}"])
        w.snapshot(2)
        w.write_batch([f"open-s{i}"])  # in-progress when the failure hits
    assert visible(tmp_path) == []
    assert len(hidden(tmp_path)) == 6
    (tmp_path / ".unrelated-hidden").write_text("keep")
    (tmp_path / "_SUCCESS").write_text("keep")

    # Attempt 1 starts; subtask 1 writes first, then subtask 0 recovers.
    restored = [writer(tmp_path, subtask=i, parallelism=2, attempt=1) for i in range(2)]
    restored[1].restore(checkpoint1)
    restored[1].write_batch(["a1-s1"])
    assert visible(tmp_path) == []  # only subtask 0 recovers
    restored[0].restore(checkpoint1)
    assert sorted(committed_records(tmp_path)) == ["c1-s0", "c1-s1"]
    assert hidden(tmp_path) == [".part-1-01234567-a1-000001.jsonl.inprogress", ".unrelated-hidden"]
    assert (tmp_path / "_SUCCESS").exists()
    restored[1].snapshot(3)
    restored[1].notify_checkpoint_complete(3)
    assert sorted(committed_records(tmp_path)) == ["a1-s1", "c1-s0", "c1-s1"]
    for w in writers + restored:
        w.close()


def test_restore_at_lower_parallelism_commits_every_subtasks_entries(tmp_path: Path) -> None:
    entries: list[Any] = []
    for i in range(3):
        w = writer(tmp_path, subtask=i, parallelism=3)
        w.restore([])
        w.write_batch([i])
        entries.extend(w.snapshot(7))
    single = writer(tmp_path, attempt=1)
    single.restore(entries)
    assert sorted(committed_records(tmp_path)) == [0, 1, 2]
    assert hidden(tmp_path) == []


def test_roll_records_makes_several_files(tmp_path: Path) -> None:
    w = writer(tmp_path, roll_records=2)
    w.restore([])
    w.write_batch(list(range(5)))
    assert len(w.snapshot(1)) == 3
    w.notify_checkpoint_complete(1)
    assert [len((tmp_path / n).read_text().splitlines()) for n in visible(tmp_path)] == [2, 2, 1]
    assert committed_records(tmp_path) == [0, 1, 2, 3, 4]


def test_checkpointing_off_commits_on_end_input(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        w = writer(tmp_path, checkpointing=False, roll_records=3)
    assert sum("at-least-once" in r.getMessage() for r in caplog.records) == 1
    w.restore([])
    w.write_batch(list(range(4)))
    assert committed_records(tmp_path) == [0, 1, 2]  # the rolled file
    w.end_input()
    assert committed_records(tmp_path) == [0, 1, 2, 3]
    assert hidden(tmp_path) == []
    w.close()


def test_unencodable_record_names_record_and_type(tmp_path: Path) -> None:
    w = writer(tmp_path)
    w.restore([])

    class Point:
        def __repr__(self) -> str:
            return "Point(" + "9" * 500 + ")"

    with pytest.raises(SinkError) as info:
        w.write_batch([{"ok": 1}, Point()])
    message = str(info.value)
    assert "Point(999" in message and "Point" in message
    assert "9" * 300 not in message  # the repr is truncated
    assert "of type test_unencodable_record_names_record_and_type.<locals>.Point" in message
    assert info.value.suppress_restarts, "the same record would come back after a restart"
    with pytest.raises(SinkError, match=r"\{\(1, 2\): 'tuple key'\}.*type dict"):
        w.write_batch([{(1, 2): "tuple key"}])


def test_bad_formats_and_rolling_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="xml"):
        FileSink(tmp_path, format="xml")
    with pytest.raises(ConfigurationError, match="roll_records"):
        FileSink(tmp_path, roll_records=0)
    with pytest.raises(ConfigurationError, match="max_bytes"):
        RollingPolicy(max_bytes=0)
    with pytest.raises(ConfigurationError, match="not both"):
        FileSink(tmp_path, roll_records=3, rolling=RollingPolicy(max_seconds=1))


def _commit_all(w: FileSinkWriter, batches: list[list[Any]], checkpoint_every: int) -> None:
    w.restore([])
    for n, batch in enumerate(batches, start=1):
        w.write_batch(batch)
        if n % checkpoint_every == 0:
            w.snapshot(n)
            w.notify_checkpoint_complete(n)
    w.snapshot(len(batches) + 1)
    w.notify_checkpoint_complete(len(batches) + 1)


def test_csv_writes_a_header_per_file_and_rolls_by_bytes(tmp_path: Path) -> None:
    rows = [{"id": i, "name": f"n,{i}"} for i in range(40)]
    w = FileSink(tmp_path, format="csv", rolling=RollingPolicy(max_bytes=100)).create_writer(ctx())
    _commit_all(w, [rows[i : i + 4] for i in range(0, 40, 4)], checkpoint_every=100)
    names = visible(tmp_path)
    assert len(names) > 1 and all(n.endswith(".csv") for n in names), names
    back: list[dict[str, str]] = []
    for name in names:
        with open(tmp_path / name, newline="") as f:
            back += list(csv.DictReader(f))
    assert back == [{"id": str(r["id"]), "name": r["name"]} for r in rows]


def test_csv_rejects_a_record_that_does_not_match_the_header(tmp_path: Path) -> None:
    w = FileSink(tmp_path, format="csv").create_writer(ctx())
    w.restore([])
    w.write_batch([{"a": 1}])
    expected = r"record \{'b': 2\} of type dict is not a dict with the columns \['a'\]"
    with pytest.raises(SinkError, match=expected) as info:
        w.write_batch([{"b": 2}])
    assert info.value.suppress_restarts


def test_parquet_rolls_on_checkpoint_and_reads_back(tmp_path: Path) -> None:
    w = FileSink(tmp_path, format="parquet").create_writer(ctx())
    batches = [[{"k": f"w{i}", "n": i}] * 3 for i in range(6)]
    _commit_all(w, batches, checkpoint_every=2)
    names = visible(tmp_path)
    assert len(names) == 3 and all(n.endswith(".parquet") for n in names), names
    table = pq.read_table(tmp_path)
    assert sorted(table.to_pylist(), key=lambda r: r["n"]) == [r for b in batches for r in b]


def test_parquet_uncommitted_rows_are_not_visible(tmp_path: Path) -> None:
    w = FileSink(tmp_path, format="parquet").create_writer(ctx())
    w.restore([])
    w.write_batch([{"a": 1}])
    entries = w.snapshot(1)
    assert visible(tmp_path) == [] and len(hidden(tmp_path)) == 1
    w.write_batch([{"a": 2}])
    w.close()  # crash before checkpoint 1 completes: a restore commits what it covers
    again = FileSink(tmp_path, format="parquet").create_writer(ctx(attempt=1))
    again.restore(entries)
    assert pq.read_table(tmp_path).to_pylist() == [{"a": 1}]
    assert hidden(tmp_path) == []


def test_sink_is_picklable_and_transactional(tmp_path: Path) -> None:
    sink = pickle.loads(pickle.dumps(FileSink(tmp_path, roll_records=10)))
    assert sink.transactional is True
    assert (sink.path, sink.rolling) == (str(tmp_path), RollingPolicy(max_records=10))


def test_text_source_to_file_sink_is_exactly_once_across_a_crash(tmp_path: Path) -> None:
    """Drive source readers and sink writers as the runtime would, failing once mid-way."""
    lines = [f"line-{i}" for i in range(1000)]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    source = TextFileSource(src, chunk_size=256)
    sink = FileSink(out, roll_records=50)
    p = 2

    def start(attempt: int, states: list[Any], entries: list[Any]) -> tuple[list[Any], list[Any]]:
        readers = [source.create_reader(SourceContext(i, p, ManualClock())) for i in range(p)]
        for i, reader in enumerate(readers):
            reader.add_splits(states[i::p])
        writers = [sink.create_writer(ctx(i, p, attempt)) for i in range(p)]
        for w in writers:
            w.restore(entries)
        return readers, writers

    def checkpoint(cid: int, readers: list[Any], writers: list[Any]) -> tuple[list[Any], list[Any]]:
        states = [s for r in readers for s in r.snapshot(1)]
        entries = [e for w in writers for e in w.snapshot(cid)]
        return states, entries

    # Three byte-range splits over two readers: split k goes to reader k % p.
    splits = [
        TextFileSplit(f"{src}:{s}", str(src), s, e, s)
        for s, e in [(0, 3000), (3000, 6000), (6000, src.stat().st_size)]
    ]
    readers, writers = start(0, splits, [])
    completed: tuple[list[Any], list[Any]] = (splits, [])
    for cid in range(1, 4):
        for _ in range(3):
            for r, w in zip(readers, writers, strict=True):
                w.write_batch(r.poll(29))
        completed = checkpoint(cid, readers, writers)
        if cid < 3:  # checkpoint 3 completes, but the failure hits before the notification
            for w in writers:
                w.notify_checkpoint_complete(cid)
    for r, w in zip(readers, writers, strict=True):
        w.write_batch(r.poll(40))  # written after checkpoint 3, then lost in the crash
    for r in readers:
        r.close()
    for w in writers:
        w.close()

    readers, writers = start(1, *completed)
    cid = 4
    while not all(r.exhausted for r in readers):
        for r, w in zip(readers, writers, strict=True):
            w.write_batch(r.poll(31))
        checkpoint(cid, readers, writers)
        for w in writers:
            w.notify_checkpoint_complete(cid)
        cid += 1
    for w in writers:
        w.end_input()
        w.close()
    assert sorted(committed_records(out)) == sorted(lines)
    assert hidden(out) == []


def test_parquet_rows_that_make_no_table_fail_without_restarts(tmp_path: Path) -> None:
    w = FileSink(tmp_path, format="parquet").create_writer(ctx())
    w.restore([])
    w.write_batch([{"k": 1}, {"k": "not an int"}])
    with pytest.raises(SinkError, match="cannot build an Arrow table from 2 records") as info:
        w.snapshot(1)
    assert info.value.suppress_restarts


def test_two_file_sinks_of_one_job_in_one_directory_are_refused(tmp_path: Path) -> None:
    """Their part names collided (FileExistsError on every attempt, burning through the
    restart strategy), and each one's recovery removed the other's pending files."""
    import epochstream as es

    env = es.Environment(parallelism=1)
    ds = env.from_collection([1, 2, 3])
    ds.sink_to(FileSink(tmp_path / "out"))
    with pytest.raises(
        ConfigurationError, match=r"sink_to\(FileSink\): directory .*out is written by another sink"
    ):
        ds.map(str).sink_to(FileSink(str(tmp_path / "sub" / ".." / "out"), format="csv"))
    ds.sink_to(FileSink(tmp_path / "other"))  # another directory is fine
    assert FileSink(tmp_path / "x").exclusive_target() == f"directory {tmp_path / 'x'}"
