"""Operator outputs (runtime/operator_outputs.py) and their wiring (runtime/chain.py),
with fake consumers and writers."""

from __future__ import annotations

from typing import Any

from output_support import RecordingOutput

from epochstream.core.events import ACTIVE, IDLE, Watermark
from epochstream.graph.jobgraph import ChainSpec, OperatorSpec, OutputSpec
from epochstream.runtime.chain import wire_chain
from epochstream.runtime.metrics import OperatorCounters
from epochstream.runtime.operator_outputs import (
    DISCARD,
    ChainedOutput,
    FanOutOutput,
    NetworkOutput,
    Output,
)


class FakeConsumer:
    """A chained operator: keeps what it is given."""

    def __init__(self) -> None:
        self.batches: list[tuple[Any, Any]] = []
        self.marks: list[int] = []
        self.statuses: list[bool] = []

    def process_batch(self, records: Any, timestamps: Any) -> None:
        self.batches.append((records, timestamps))

    def process_watermark(self, mark: int) -> None:
        self.marks.append(mark)

    def process_status(self, idle: bool) -> None:
        self.statuses.append(idle)


class FakeWriter:
    """A record writer: keeps what it is asked to write and broadcast."""

    def __init__(self) -> None:
        self.written: list[tuple[Any, Any]] = []
        self.events: list[Any] = []

    def write(self, records: Any, timestamps: Any = None) -> None:
        self.written.append((records, timestamps))

    def broadcast_event(self, event: Any) -> None:
        self.events.append(event)


class Batches(RecordingOutput):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[tuple[Any, Any]] = []

    def collect(self, records: Any, timestamps: Any = None) -> None:
        self.batches.append((records, timestamps))


def test_chained_output_counts_both_ends_and_calls_the_consumer() -> None:
    consumer = FakeConsumer()
    produced, consumed = OperatorCounters("a", "a"), OperatorCounters("b", "b")
    out = ChainedOutput(consumer, produced=produced, consumed=consumed)  # type: ignore[arg-type]
    out.collect([1, 2, 3], [10, 20, 30])
    out.collect([4], None)
    assert consumer.batches == [([1, 2, 3], [10, 20, 30]), ([4], None)]
    assert (produced.records_out, consumed.records_in) == (4, 4)
    out.emit_watermark(7)
    out.emit_status(True)
    assert consumer.marks == [7] and consumed.watermark == 7 and consumer.statuses == [True]


def test_network_output_writes_and_broadcasts_events_in_band() -> None:
    writer = FakeWriter()
    produced = OperatorCounters("a", "a")
    out = NetworkOutput(writer, produced=produced)  # type: ignore[arg-type]
    out.collect(["x", "y"], None)
    out.emit_watermark(5)
    out.emit_status(True)
    out.emit_status(False)
    assert writer.written == [(["x", "y"], None)] and produced.records_out == 2
    assert writer.events == [Watermark(5), IDLE, ACTIVE]


def test_fan_out_counts_records_out_once_and_reaches_every_output() -> None:
    consumer, writer = FakeConsumer(), FakeWriter()
    produced, consumed = OperatorCounters("a", "a"), OperatorCounters("b", "b")
    out = FanOutOutput(
        [
            ChainedOutput(consumer, produced=None, consumed=consumed),  # type: ignore[arg-type]
            NetworkOutput(writer, produced=None),  # type: ignore[arg-type]
        ],
        produced=produced,
    )
    out.collect([1, 2], None)
    out.emit_watermark(3)
    assert produced.records_out == 2 and consumed.records_in == 2
    assert consumer.batches == [([1, 2], None)] and writer.written == [([1, 2], None)]
    assert consumer.marks == [3] and writer.events == [Watermark(3)]


def test_discard_drops_everything() -> None:
    DISCARD.collect([1], None)
    DISCARD.emit_watermark(1)
    DISCARD.emit_status(True)
    assert isinstance(DISCARD, Output)


class WiredOp(FakeConsumer):
    """An operator as wire_chain sees it: counters, output, side outputs."""

    def __init__(self, uid: str) -> None:
        super().__init__()
        self.uid = uid
        self.output: Output = DISCARD
        self.side_outputs: dict[str, Output] = {}


def test_wire_chain_builds_one_output_per_stream() -> None:
    chain = ChainSpec(
        "c",
        [
            OperatorSpec(
                "a",
                "a",
                "process",
                None,
                outputs=[
                    OutputSpec("main", chained_uid="b"),
                    OutputSpec("main", edge_id=0),
                    OutputSpec("late", edge_id=1),
                ],
            ),
            OperatorSpec("b", "b", "map", None, outputs=[]),
        ],
    )
    ops = {"a": WiredOp("a"), "b": WiredOp("b")}
    writers = {0: FakeWriter(), 1: FakeWriter()}
    counters = {uid: OperatorCounters(uid, uid) for uid in ops}
    wire_chain(chain, ops, writers, counters)  # type: ignore[arg-type]
    a = ops["a"]
    assert isinstance(a.output, FanOutOutput)
    assert [type(o) for o in a.output.outputs] == [ChainedOutput, NetworkOutput]
    assert isinstance(a.side_outputs["late"], NetworkOutput)
    assert ops["b"].output is DISCARD
    a.output.collect([1, 2], None)
    a.side_outputs["late"].collect([3], None)
    # Each batch counts once in records_out, whichever output it took.
    assert counters["a"].records_out == 3 and counters["b"].records_in == 2
    assert writers[0].written == [([1, 2], None)] and writers[1].written == [([3], None)]


def test_operator_watermarks_reach_main_and_side_outputs() -> None:
    from epochstream.runtime.operators import Operator

    main, late = Batches(), Batches()

    class Host:
        output = main
        side_outputs = {"late": late}

    Operator.emit_watermark(Host(), 9)  # type: ignore[arg-type]
    Operator.emit_status(Host(), True)  # type: ignore[arg-type]
    assert main.watermarks == late.watermarks == [9]
    assert main.statuses == late.statuses == [True]
