"""Processing-time timers: registration, deletion, firing order, snapshot and restore."""

from __future__ import annotations

import pytest

import epochstream as es
from epochstream.checkpoint.filesystems import storage_fs
from epochstream.runtime.clock import ManualClock
from epochstream.runtime.timers import TIMERS_STATE, TimerService
from epochstream.state.backends.base import KeyedBackendContext, SnapshotTarget
from epochstream.state.backends.heap import HeapKeyedStateBackend
from epochstream.state.keygroups import key_group_range_for_operator


def _backend(p: int = 1, i: int = 0) -> HeapKeyedStateBackend:
    return HeapKeyedStateBackend(
        KeyedBackendContext(
            operator_uid="t",
            subtask=i,
            max_parallelism=128,
            key_group_range=key_group_range_for_operator(128, p, i),
            clock=ManualClock(),
            local_dir="",
        )
    )


def test_register_delete_and_fire_in_time_order() -> None:
    backend = _backend()
    timers = TimerService(backend)
    for key, ts in [("a", 5.0), ("b", 3.0), ("a", 1.0), ("a", 5.0)]:
        backend.set_current_key(key)
        timers.register_processing_time_timer(ts)
    backend.set_current_key("b")
    timers.delete_processing_time_timer(3.0)
    assert timers.next_deadline() == 1.0
    assert timers.pop_due(0.5) == []
    assert timers.pop_due(4.0) == [(1.0, "a")]
    assert timers.pop_due(10.0) == [(5.0, "a")]
    assert timers.next_deadline() is None
    assert backend.keys(TIMERS_STATE) == []


def test_timers_survive_snapshot_and_follow_their_key_group(tmp_path) -> None:
    backend = _backend()
    timers = TimerService(backend)
    keys = [f"k{i}" for i in range(40)]
    for n, key in enumerate(keys):
        backend.set_current_key(key)
        timers.register_processing_time_timer(100.0 + n)
    target = SnapshotTarget(
        fs=storage_fs(str(tmp_path)),
        checkpoint_id=1,
        directory=str(tmp_path / "chk-1"),
        shared_dir=str(tmp_path / "shared"),
        name="t-0",
    )
    job = backend.snapshot(target)
    timers.pop_due(1e9)  # later firing must not leak into the snapshot
    handle = job.run()
    assert handle is not None
    fired: dict[str, float] = {}
    for i in range(2):
        restored = _backend(2, i)
        mine = handle.restricted_to(restored.key_group_range)
        restored.restore([mine] if mine else [], checkpoint_id=1, owned=False)
        for ts, key in TimerService(restored).pop_due(1e9):
            assert key not in fired
            fired[key] = ts
    assert fired == {key: 100.0 + n for n, key in enumerate(keys)}


class IdleAlarm(es.KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.get_state(es.state.ValueStateDescriptor("count", default=0))

    def process_element(self, value, ctx, out):
        if self.count.value() == 0:
            timers = ctx.timer_service()
            timers.register_processing_time_timer(timers.current_processing_time() + 0.3)
        self.count.update(self.count.value() + 1)

    def on_timer(self, timestamp, ctx, out):
        out.collect([ctx.current_key, self.count.value(), timestamp])


@pytest.mark.slow
def test_on_timer_runs_with_the_key_and_its_state(tmp_path) -> None:
    env = es.Environment(parallelism=2, runner="local")
    (
        env.from_sequence(0, 3000, rate=2000)
        .key_by(lambda i: i % 3)
        .process(IdleAlarm())
        .sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    )
    env.execute("timers")
    rows = es.testing.read_committed(tmp_path / "out")
    assert sorted(r[0] for r in rows) == [0, 1, 2]
    assert all(0 < count < 1000 for _, count, _ in rows)
