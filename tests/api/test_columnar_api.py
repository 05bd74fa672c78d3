"""The columnar API: which operations each form takes, and the errors that say why."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import epochstream as es
from epochstream.connectors.base import Sink, SinkContext, SinkWriter
from epochstream.exceptions import ConfigurationError


def _env() -> es.Environment:
    return es.Environment(parallelism=1, runner="local")


def test_columnar_flag_follows_the_operators() -> None:
    env = _env()
    batches = env.from_sequence(0, 10, batch_size=4)
    assert batches.columnar
    assert not env.from_sequence(0, 10).columnar
    mapped = batches.map_batches(lambda b: b.append_column("k", b["value"])).filter(
        pc.field("value") > 3
    )
    assert mapped.columnar
    assert not mapped.to_rows().columnar
    assert mapped.to_rows().to_batches(pa.schema([("value", pa.int64())])).columnar
    keyed = mapped.key_by("k")
    assert isinstance(keyed, es.ColumnarKeyedStream) and keyed.key_column == "k"
    assert keyed.sum("value").columnar and keyed.count().columnar


class _RowSink(Sink):
    """A user's sink whose writers take rows only (accepts_batches left False)."""

    def create_writer(self, ctx: SinkContext) -> SinkWriter:
        raise NotImplementedError


def _timed(env: es.Environment) -> es.DataStream:
    return env.from_sequence(0, 9, batch_size=4).map_batches(
        lambda b: pa.record_batch([b["value"], b["value"], b["value"]], names=["k", "v", "_ts"])
    )


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda e: e.from_sequence(0, 9, batch_size=4).map(str), "map\\(\\) works on rows"),
        (lambda e: e.from_sequence(0, 9).map_batches(lambda b: b), "needs a columnar stream"),
        (lambda e: e.from_sequence(0, 9).filter(pc.field("x") > 1), "needs a columnar stream"),
        (
            lambda e: e.from_sequence(0, 9, batch_size=4).key_by(lambda r: r),
            "key it by a column name",
        ),
        (
            lambda e: e.from_sequence(0, 9, batch_size=4).key_by("value").reduce(max),
            "reduce\\(\\) works on rows",
        ),
        (
            lambda e: e.from_sequence(0, 9, batch_size=4).sink_to(_RowSink()),
            "_RowSink takes rows .*call to_rows\\(\\)",
        ),
        (lambda e: e.from_sequence(0, 9, batch_size=4).union(e.from_sequence(0, 9)), "one form"),
        (
            lambda e: (
                e.from_sequence(0, 9, batch_size=4)
                .key_by("value")
                .window(es.GlobalWindows.create())
            ),
            r"columnar windows are tumbling or sliding event-time windows.*GlobalWindows: call to_rows\(\)",
        ),
        (
            lambda e: (
                e.from_sequence(0, 9, batch_size=4)
                .key_by("value")
                .window(es.ProcessingTimeSessionWindows.with_gap(5))
            ),
            "ProcessingTimeSessionWindows: call to_rows",
        ),
        (
            lambda e: (
                e.from_sequence(0, 9, batch_size=4)
                .key_by("value")
                .window(es.EventTimeSessionWindows.with_dynamic_gap(lambda r: 5))
            ),
            r"fixed gap .*to_rows\(\)",
        ),
        (lambda e: e.from_sequence(0, 9).to_batches({"a": 1}), "needs a pyarrow.Schema"),
        (
            lambda e: e.from_sequence(0, 9, batch_size=4).key_by("value").sum("value"),
            r"sum\('value'\) aggregates the key column",
        ),
        (
            lambda e: (
                e.from_sequence(0, 9, batch_size=4)
                .key_by("value")
                .window(es.TumblingEventTimeWindows.of(5))
                .max("value")
            ),
            r"max\('value'\) aggregates the key column",
        ),
        # The output would have two columns of one name (to_rows() kept one of them).
        (
            lambda e: (
                e.from_sequence(0, 9, batch_size=4)
                .map_batches(lambda b: b.rename_columns(["count"]))
                .key_by("count")
                .count()
            ),
            r"count\(\) keyed by 'count': the result would have two columns named 'count'",
        ),
        (
            lambda e: (
                e.from_sequence(0, 9, batch_size=4)
                .key_by("value")
                .window(es.TumblingEventTimeWindows.of(5))
                .sum("window_start")
            ),
            r"sum\(window_start\) keyed by 'value': the result would have two columns named 'window_start'",
        ),
        # _ts is the event time, which every result carries itself.
        *(
            (
                build,
                r"keyed by '(k|_ts)': '_ts' is the event-time column, which the result carries",
            )
            for build in (
                lambda e: _timed(e).key_by("k").sum("_ts"),
                lambda e: _timed(e).key_by("_ts").count(),
                lambda e: (
                    _timed(e).key_by("_ts").window(es.TumblingEventTimeWindows.of(5)).sum("v")
                ),
                lambda e: (
                    _timed(e).key_by("k").window(es.TumblingEventTimeWindows.of(5)).max("_ts")
                ),
            )
        ),
        *(
            (
                lambda e, m=method: getattr(
                    e.from_sequence(0, 9, batch_size=4)
                    .key_by("value")
                    .window(es.TumblingEventTimeWindows.of(5)),
                    m,
                )(max),
                rf"{method}\(\) works on windows of rows; these windows are columnar: .*to_rows\(\)",
            )
            for method in (
                "reduce",
                "aggregate",
                "process",
                "min_by",
                "max_by",
                "trigger",
                "allowed_lateness",
                "side_output_late_data",
            )
        ),
    ],
)
def test_misuse_is_refused_when_the_job_is_built(build, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigurationError, match=message):
        build(_env())


def test_w1_columnar_program_builds_as_written() -> None:
    def to_kv(b: pa.RecordBatch) -> pa.RecordBatch:
        v = b["value"]
        return pa.record_batch(
            [pc.remainder(pc.multiply(v, 7919), 100_000), pc.remainder(v, 1000)], names=["k", "v"]
        )

    env = _env()
    (
        env.from_sequence(0, 10_000_000, batch_size=65_536)
        .map_batches(to_kv)
        .key_by("k")
        .sum("v")
        .sink_to(es.sinks.DiscardSink())
    )
    kinds = [op.kind for chain in env.job_graph().chains for op in chain.operators]
    assert kinds == ["source", "map_batches", "columnar_aggregate", "sink"]


def test_session_and_processing_time_windows_build_their_columnar_operators() -> None:
    env = _env()
    keyed = (
        env.from_sequence(0, 9, batch_size=4)
        .map_batches(lambda b: b.append_column("k", b["value"]))
        .key_by("k")
    )
    sessions = keyed.window(es.EventTimeSessionWindows.with_gap(10_000)).sum("value")
    tumbling = keyed.window(es.TumblingProcessingTimeWindows.of(10_000)).count()
    sliding = keyed.window(es.SlidingProcessingTimeWindows.of(10_000, 5_000)).mean("value")
    assert sessions.columnar and tumbling.columnar and sliding.columnar
    kinds = [s._t.kind for s in (sessions, tumbling, sliding)]
    assert kinds == [
        "columnar_session_window",
        "columnar_processing_window",
        "columnar_processing_window",
    ]
    assert sliding._t.payload.slide == 5_000
    assert sessions._t.payload.gap == 10_000


@pytest.mark.parametrize(
    "sink",
    [
        es.sinks.FileSink("/tmp/x", format="parquet"),
        es.sinks.PostgresSink("host=nowhere", "t"),
        es.sinks.DeltaSink("/tmp/delta"),
        es.sinks.JetStreamSink("nats://nowhere:4222", "out"),
        es.sinks.KafkaSink("nowhere:9092", "out", transactional_id_prefix="p"),
    ],
    ids=lambda s: type(s).__name__,
)
def test_a_columnar_stream_goes_into_every_built_in_sink_without_to_rows(sink: Sink) -> None:
    env = es.Environment()
    env.from_sequence(0, 9, batch_size=4).sink_to(sink)  # no ConfigurationError
    assert sink.accepts_batches
