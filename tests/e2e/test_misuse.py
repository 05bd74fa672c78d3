"""Misuse a new user runs into: errors name the place, cannot-fix errors never restart,
unusable storage fails before any record is read, execute() runs each pipeline once."""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

import epochstream as es

pytestmark = pytest.mark.slow


def _env(tmp_path: Path, parallelism: int = 2) -> es.Environment:
    env = es.Environment(parallelism=parallelism, runner="local")
    env.enable_checkpointing(0.2, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.1))
    return env


def _tags(record: dict) -> list:
    return record["tags"]


def test_unhashable_key_fails_once_naming_selector_and_record(tmp_path: Path) -> None:
    env = _env(tmp_path)
    (
        env.from_collection([{"tags": ["a"], "n": i} for i in range(100)])
        .key_by(_tags)
        .map(lambda r: r["n"])
        .sink_to(es.sinks.DiscardSink())
    )
    with pytest.raises(es.JobExecutionError) as info:
        env.execute("unhashable")
    err = info.value
    assert err.restarts == 0, "retrying cannot fix a key that is not hashable"
    assert "key selector _tags (test_misuse.py:" in err.cause
    assert "unhashable key ['a']" in err.cause and "'n': " in err.cause


def _with_lock(i: int) -> tuple[int, object]:
    return (i % 3, threading.Lock())


def test_unpicklable_record_names_record_and_edge(tmp_path: Path) -> None:
    env = _env(tmp_path)
    env.from_sequence(0, 1000).map(_with_lock).key_by(lambda t: t[0]).map(lambda t: t[0]).uid(
        "after-shuffle"
    ).sink_to(es.sinks.DiscardSink())
    with pytest.raises(es.JobExecutionError) as info:
        env.execute("unpicklable")
    err = info.value
    assert err.restarts == 0
    assert "cannot cross edge" in err.cause and "(hash)" in err.cause
    assert "_thread.lock" in err.cause or "lock" in err.cause


def test_same_records_are_fine_within_one_slot(tmp_path: Path) -> None:
    """The documented rule: records are pickled only between slots."""
    env = _env(tmp_path, parallelism=1)
    sink = es.sinks.FileSink(str(tmp_path / "out"))
    env.from_sequence(0, 100).map(_with_lock).key_by(lambda t: t[0]).map(lambda t: t[0]).sink_to(
        sink
    )
    env.execute("one-slot")
    assert len(es.testing.read_committed(tmp_path / "out")) == 100


@dataclass(frozen=True)
class Reading:
    """A record class of the job's own module: slots know it only by value."""

    sensor: str
    value: int


def test_records_of_script_defined_classes_cross_slots(tmp_path: Path) -> None:
    env = _env(tmp_path)
    (
        env.from_sequence(0, 3000)
        .map(lambda i: Reading(f"s{i % 5}", i))
        .key_by(lambda r: r.sensor)
        .reduce(lambda a, b: Reading(a.sensor, a.value + b.value))
        .map(lambda r: [r.sensor, r.value])
        .sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    )
    env.execute("classes")
    finals: dict[str, int] = {}
    for sensor, value in es.testing.read_committed(tmp_path / "out"):
        finals[sensor] = max(finals.get(sensor, 0), value)
    assert finals == {f"s{k}": sum(range(k, 3000, 5)) for k in range(5)}


class _Marker(es.MapFunction):
    def __init__(self, path: str) -> None:
        self.path = path

    def map(self, value: int) -> int:
        Path(self.path).touch()
        return value


def test_unusable_storage_fails_before_any_record_is_read(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.2, storage=str(blocker / "ckpt"))
    marker = tmp_path / "touched"
    env.from_sequence(0, 100).map(_Marker(str(marker))).sink_to(es.sinks.DiscardSink())
    with pytest.raises(es.CheckpointError) as info:
        env.execute("bad-storage")
    assert str(blocker) in str(info.value)
    assert not marker.exists(), "records were processed before the storage was checked"


def test_execute_twice_runs_each_pipeline_once(tmp_path: Path) -> None:
    env = _env(tmp_path)
    first = env.from_collection(["a", "b"])
    first.sink_to(es.sinks.FileSink(str(tmp_path / "one")))
    env.execute("first")
    env.from_collection(["c"]).sink_to(es.sinks.FileSink(str(tmp_path / "two")))
    env.execute("second")
    assert sorted(es.testing.read_committed(tmp_path / "one")) == ["a", "b"]
    assert es.testing.read_committed(tmp_path / "two") == ["c"]
    with pytest.raises(es.ConfigurationError, match="already ran"):
        first.map(str.upper)
    with pytest.raises(es.ConfigurationError, match="no operators"):
        env.execute("nothing built")


_SCRIPT_SOURCE = """
import sys
import epochstream as es


class Part:                      # a split class of the job script itself (__main__)
    def __init__(self, split_id, start, end, pos=0):
        self.split_id, self.start, self.end, self.pos = split_id, start, end, pos


class Numbers(es.sources.Source):
    def create_splits(self, parallelism):
        return [Part(f"part-{i}", i * 500, (i + 1) * 500) for i in range(4)]

    def create_reader(self, ctx):
        return Reader()


class Reader(es.sources.SourceReader):
    def __init__(self):
        self.parts = []

    def add_splits(self, splits):
        self.parts.extend(splits)

    def poll(self, max_records):
        out = []
        for p in self.parts:
            take = min(max_records - len(out), p.end - p.start - p.pos)
            out += range(p.start + p.pos, p.start + p.pos + take)
            p.pos += take
        return out

    @property
    def exhausted(self):
        return all(p.pos >= p.end - p.start for p in self.parts)

    def snapshot(self):          # the form without the checkpoint id still works
        return [Part(p.split_id, p.start, p.end, p.pos) for p in self.parts]

    def close(self):
        self.parts = []


env = es.Environment(parallelism=2, runner="local")
env.enable_checkpointing(0.2, storage=sys.argv[1] + "/ckpt")
env.from_source(Numbers()).sink_to(es.sinks.FileSink(sys.argv[1] + "/out"))
env.execute("script-splits")
"""


def test_sources_whose_splits_are_script_classes_deploy(tmp_path: Path) -> None:
    """Splits made in the driver from classes of the job script (``__main__``) reach
    slot processes, which know that module by another name."""
    script = tmp_path / "job.py"
    script.write_text(_SCRIPT_SOURCE)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(es.testing.read_committed(tmp_path / "out")) == list(range(2000))


def _refuse_to_load() -> None:
    raise RuntimeError("this object cannot be rebuilt in a slot")


class _Unloadable:
    """Pickles fine; unpickling raises (as a class missing on a worker would)."""

    def __reduce__(self) -> tuple:
        return (_refuse_to_load, ())


def test_a_deployment_that_does_not_load_fails_without_restarts(tmp_path: Path) -> None:
    env = _env(tmp_path)
    captured = _Unloadable()
    env.from_sequence(0, 10).map(lambda x: (captured, x)[1]).sink_to(es.sinks.DiscardSink())
    with pytest.raises(es.JobExecutionError) as info:
        env.execute("unloadable")
    err = info.value
    assert err.restarts == 0, "the same bytes fail to load on every attempt"
    assert "cannot load its deployment" in err.cause
    assert "this object cannot be rebuilt in a slot" in err.cause
