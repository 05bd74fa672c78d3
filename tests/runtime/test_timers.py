"""Timers: registration, deletion, firing order per domain, namespaces, snapshot and
restore at another parallelism, on both state backends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import epochstream as es
from epochstream.core.clock import ManualClock
from epochstream.core.filesystems import storage_fs
from epochstream.core.time import TimeDomain
from epochstream.runtime.timers import TIMERS_STATE, InternalTimerService, TimerService
from epochstream.state.backends.base import KeyedBackendContext, KeyedStateBackend, SnapshotTarget
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend
from epochstream.state.keygroups import key_group_range_for_operator


class Backends:
    def __init__(self, kind: str, root: Path) -> None:
        self.kind = kind
        self.root = root
        self.made = 0

    def create(self, p: int = 1, i: int = 0) -> KeyedStateBackend:
        self.made += 1
        config = (
            HeapStateBackend() if self.kind == "heap" else RocksDBStateBackend(block_cache_mb=8)
        )
        return config.create(
            KeyedBackendContext(
                operator_uid="t",
                subtask=i,
                max_parallelism=128,
                key_group_range=key_group_range_for_operator(128, p, i),
                clock=ManualClock(),
                local_dir=str(self.root / f"local-{self.made}"),
            )
        )

    def target(self, n: int) -> SnapshotTarget:
        return SnapshotTarget(
            fs=storage_fs(str(self.root)),
            checkpoint_id=n,
            directory=str(self.root / f"chk-{n}"),
            shared_dir=str(self.root / "shared"),
            name="t-0",
        )


@pytest.fixture(params=["heap", "rocksdb"])
def backends(request: pytest.FixtureRequest, tmp_path: Path) -> Backends:
    return Backends(request.param, tmp_path)


class Fired:
    """Records (domain, timestamp, key, namespace) of every firing."""

    def __init__(self) -> None:
        self.calls: list[tuple[TimeDomain, int, Any, Any]] = []

    def __call__(self, domain: TimeDomain, ts: int, key: Any, ns: Any) -> None:
        self.calls.append((domain, ts, key, ns))


def test_each_domain_fires_in_time_order_and_deletes_count(backends: Backends) -> None:
    backend = backends.create()
    fired = Fired()
    timers = InternalTimerService(backend, lambda: 0, fired)
    for key, ts in [("a", 5), ("b", 3), ("a", 1), ("a", 5)]:
        backend.set_current_key(key)
        timers.register_processing_time_timer(None, ts)
        timers.register_event_time_timer("w", ts * 10)
    backend.set_current_key("b")
    timers.delete_processing_time_timer(None, 3)
    assert timers.next_processing_time() == 1
    timers.on_processing_time(0)
    assert fired.calls == []
    timers.on_processing_time(4)
    assert fired.calls == [(TimeDomain.PROCESSING_TIME, 1, "a", None)]
    timers.advance_watermark(30)
    assert fired.calls[1:] == [
        (TimeDomain.EVENT_TIME, 10, "a", "w"),
        (TimeDomain.EVENT_TIME, 30, "b", "w"),
    ]
    assert timers.current_watermark == 30
    timers.on_processing_time(10)
    timers.advance_watermark(es.WatermarkGenerator.MAX_WATERMARK)
    assert [c[1] for c in fired.calls[3:]] == [5, 50]
    assert timers.next_processing_time() is None and timers.pending() == 0
    assert backend.keys(TIMERS_STATE) == []


def test_the_key_is_current_when_a_timer_fires_and_new_due_timers_fire_too(
    backends: Backends,
) -> None:
    backend = backends.create()
    seen: list[Any] = []

    def fire(domain: TimeDomain, ts: int, key: Any, ns: Any) -> None:
        seen.append((backend.current_key, ts))
        if ts == 10:
            timers.register_event_time_timer(None, 15)  # due already: fires in this round

    timers = InternalTimerService(backend, lambda: 0, fire)
    backend.set_current_key("x")
    timers.register_event_time_timer(None, 10)
    backend.set_current_key("y")
    timers.advance_watermark(20)
    assert seen == [("x", 10), ("x", 15)]


def test_timer_time_must_be_int_milliseconds(backends: Backends) -> None:
    backend = backends.create()
    timers = TimerService(InternalTimerService(backend, lambda: 0, Fired()))
    backend.set_current_key("k")
    with pytest.raises(es.ConfigurationError, match="int milliseconds"):
        timers.register_event_time_timer(1.5)  # type: ignore[arg-type]


def test_timers_survive_a_snapshot_and_follow_their_key_group(backends: Backends) -> None:
    backend = backends.create()
    timers = InternalTimerService(backend, lambda: 0, Fired())
    keys = [f"k{i}" for i in range(40)]
    for n, key in enumerate(keys):
        backend.set_current_key(key)
        timers.register_event_time_timer(es.TimeWindow(0, 10), 100 + n)
        timers.register_processing_time_timer(None, 500 + n)
    timers.flush()  # as the operator does before every snapshot
    job = backend.snapshot(backends.target(1))
    timers.advance_watermark(
        es.WatermarkGenerator.MAX_WATERMARK
    )  # later firing must not leak into the snapshot
    handle = job.run()
    assert handle is not None
    event: dict[str, int] = {}
    proc: dict[str, int] = {}
    for i in range(2):
        restored = backends.create(2, i)
        mine = handle.restricted_to(restored.key_group_range)
        restored.restore([mine] if mine else [], checkpoint_id=1, owned=False)
        fired = Fired()
        again = InternalTimerService(
            restored,
            lambda: 0,
            fired,
            namespace_of=lambda ns: ns if ns is None else es.TimeWindow(*ns),
        )
        again.advance_watermark(es.WatermarkGenerator.MAX_WATERMARK)
        again.on_processing_time(10_000)
        for domain, ts, key, ns in fired.calls:
            if domain is TimeDomain.EVENT_TIME:
                assert key not in event and ns == es.TimeWindow(0, 10) and ns.max_timestamp() == 9
                event[key] = ts
            else:
                assert key not in proc and ns is None
                proc[key] = ts
    assert event == {key: 100 + n for n, key in enumerate(keys)}
    assert proc == {key: 500 + n for n, key in enumerate(keys)}


class IdleAlarm(es.KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.get_state(es.state.ValueStateDescriptor("count", default=0))

    def process_element(self, value, ctx, out):
        if self.count.value() == 0:
            timers = ctx.timer_service()
            timers.register_processing_time_timer(timers.current_processing_time() + 300)
        self.count.update(self.count.value() + 1)

    def on_timer(self, timestamp, ctx, out):
        assert ctx.time_domain() is es.TimeDomain.PROCESSING_TIME
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
    assert all(isinstance(ts, int) for _, _, ts in rows)
