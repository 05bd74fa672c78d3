"""The input gate of unaligned checkpoints: overtaking barriers ahead of data, cuts, channel
state captures, promotion of timed-out aligned barriers, and credit."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from epochstream.core.events import (
    END_OF_INPUT,
    CheckpointBarrier,
    CheckpointOptions,
    Watermark,
)
from epochstream.runtime.batches import RowBatch
from epochstream.runtime.channels import MAIL, Cancelled
from epochstream.runtime.frames import FrameEncoder
from epochstream.runtime.overtaking_gate import CREDIT_BATCH, OvertakingInputGate

#: Wall-clock second the aligned-with-timeout barriers of these tests were triggered at.
T0 = 1_700_000_000.0


def overtaking(checkpoint_id: int) -> CheckpointBarrier:
    return CheckpointBarrier(checkpoint_id, T0, CheckpointOptions(unaligned=True))


def timed(checkpoint_id: int, timeout: float = 0.5) -> CheckpointBarrier:
    """An aligned barrier that turns unaligned ``timeout`` seconds after ``T0``."""
    options = CheckpointOptions(unaligned=True, aligned_timeout=timeout)
    return CheckpointBarrier(checkpoint_id, T0, options)


def rows(*records: Any) -> RowBatch:
    return RowBatch(list(records))


def frames(*items: Any) -> list[bytes]:
    encode = FrameEncoder().encode
    return [encode(item) for item in items]


def take_all(gate: OvertakingInputGate) -> list[tuple[int, Any]]:
    taken = []
    while (got := gate.take(0)) is not None:
        taken.append(got)
    return taken


# ---------------------------------------------------------------- priority and cuts


def test_overtaking_barrier_comes_before_the_data_queued_ahead_of_it() -> None:
    gate = OvertakingInputGate(2)
    gate.put(0, rows(1))
    gate.put(0, rows(2))
    gate.put(1, rows(3))
    gate.put(0, overtaking(1))
    assert gate.has_input()
    assert gate.take(0) == (0, overtaking(1))
    rest = take_all(gate)
    assert sorted(item.records[0] for _, item in rest) == [1, 2, 3]
    assert [item for ch, item in rest if ch == 0] == [rows(1), rows(2)], "FIFO kept"


def test_mail_comes_before_an_overtaking_barrier() -> None:
    gate = OvertakingInputGate(1)
    gate.put(0, overtaking(1))
    gate.put_mail("trigger")
    assert gate.take(0) == (MAIL, "trigger")
    assert gate.take(0) == (0, overtaking(1))


def test_overtaking_barrier_is_taken_from_a_blocked_channel() -> None:
    gate = OvertakingInputGate(2)
    gate.blocked[0] = True
    gate.put(0, rows(1))
    gate.put(0, overtaking(2))
    assert gate.take(0) == (0, overtaking(2))
    assert gate.take(0) is None, "the data stays behind the block"


def test_put_never_blocks_beyond_capacity() -> None:
    gate = OvertakingInputGate(1, capacity=2)
    for i in range(5):
        gate.put(0, rows(i))  # credit, not a blocking put, bounds a network channel
    assert not gate.room(0)
    assert [item.records[0] for _, item in take_all(gate)] == [0, 1, 2, 3, 4]
    assert gate.room(0)


def test_room_is_per_channel() -> None:
    gate = OvertakingInputGate(2, capacity=2)
    gate.put(0, rows(1))
    assert gate.room(0)
    gate.put(0, rows(2))
    assert not gate.room(0) and gate.room(1)
    gate.take(0)
    assert gate.room(0)


def test_take_without_data_returns_only_mail_and_overtaking_barriers() -> None:
    gate = OvertakingInputGate(1)
    gate.put(0, rows(1))
    assert gate.take(0, data=False) is None
    gate.put(0, overtaking(1))
    gate.put_mail("notify")
    assert gate.take(0, data=False) == (MAIL, "notify")
    assert gate.take(0, data=False) == (0, overtaking(1))
    assert gate.take(0, data=False) is None
    assert gate.take(0) == (0, rows(1))


def test_cancel_fails_producer_and_consumer() -> None:
    gate = OvertakingInputGate(1)
    gate.put(0, overtaking(1))
    gate.cancel()
    with pytest.raises(Cancelled):
        gate.put(0, rows(1))
    with pytest.raises(Cancelled):
        gate.take(0)


# ---------------------------------------------------------------- captures


def test_capture_copies_exactly_the_data_before_the_cut() -> None:
    gate = OvertakingInputGate(2)
    gate.put(0, rows("a"))
    assert gate.take(0) == (0, rows("a")), "taken before the barrier: not channel state"
    gate.put(0, rows("b"))
    gate.put(0, Watermark(10))
    gate.put(0, rows("c"))
    gate.put(0, overtaking(1))
    gate.put(0, rows("d"))  # after the barrier: belongs to the next checkpoint
    gate.put(1, rows("x"))
    gate.put(1, overtaking(1))
    assert gate.take(0) == (0, overtaking(1))
    assert gate.take(0) == (1, overtaking(1))
    gate.start_capture(1)
    capture = gate.finish_capture(1)
    assert capture.checkpoint_id == 1
    assert capture.frames == [frames(rows("b"), rows("c")), frames(rows("x"))]
    assert capture.size == sum(len(f) for f in frames(rows("b"), rows("c"), rows("x")))


def test_capture_records_puts_on_channels_without_their_barrier_until_it_comes() -> None:
    gate = OvertakingInputGate(3)
    gate.put(0, rows(1))
    gate.put(0, overtaking(4))
    gate.put(1, rows(2))  # queued, channel 1 has no barrier yet
    gate.take(0)
    gate.start_capture(4)
    gate.put(1, rows(3))
    gate.put(1, Watermark(5))  # watermarks are not channel state
    gate.put(2, rows(4))
    gate.put(1, overtaking(4))
    gate.put(1, rows(5))  # after channel 1's barrier
    gate.put(2, rows(6))
    gate.put(2, overtaking(4))
    gate.put(2, rows(7))
    capture = gate.finish_capture(4)
    assert capture.frames == [
        frames(rows(1)),
        frames(rows(2), rows(3)),
        frames(rows(4), rows(6)),
    ]


def test_capture_keeps_the_bytes_a_network_put_carried() -> None:
    gate = OvertakingInputGate(2)
    gate.put(0, overtaking(1))
    gate.take(0)
    gate.start_capture(1)
    gate.put(1, rows(9), frame=b"as-received")
    gate.put(1, rows(10))
    gate.put(1, overtaking(1), frame=b"barrier-bytes")
    assert gate.finish_capture(1).frames == [[], [b"as-received", *frames(rows(10))]]


def test_capture_encodes_arrow_batches_as_ipc_frames() -> None:
    batch = pa.record_batch({"k": [1, 2], "v": ["a", "b"]})
    gate = OvertakingInputGate(2)
    gate.put(0, batch)
    gate.put(0, overtaking(1))
    gate.take(0)
    gate.start_capture(1)
    gate.put(1, batch)
    capture = gate.finish_capture(1)
    assert capture.frames == [frames(batch), frames(batch)]
    assert capture.frames[0][0] != frames(rows(1))[0]


def test_end_of_input_stops_the_recording_and_ended_channels_are_not_recorded() -> None:
    gate = OvertakingInputGate(3)
    gate.put(2, rows("queued"))
    gate.put(2, END_OF_INPUT)  # ended, its last records still queued
    gate.put(0, overtaking(1))
    gate.take(0)
    gate.start_capture(1)
    gate.put(1, rows("a"))
    gate.put(1, END_OF_INPUT)
    capture = gate.finish_capture(1)
    assert capture.frames == [[], frames(rows("a")), frames(rows("queued"))]


def test_two_captures_at_once() -> None:
    gate = OvertakingInputGate(2)
    gate.put(0, rows("a"))
    gate.put(0, overtaking(1))
    gate.put(0, rows("b"))
    gate.put(0, overtaking(2))
    gate.put(1, rows("c"))
    assert gate.take(0) == (0, overtaking(1))
    gate.start_capture(1)
    assert gate.take(0) == (0, overtaking(2))
    gate.start_capture(2)
    gate.put(1, rows("d"))  # both record it
    gate.put(1, overtaking(1))
    gate.put(1, rows("e"))  # only checkpoint 2 records it
    gate.put(1, overtaking(2))
    gate.put(1, rows("f"))
    assert gate.finish_capture(1).frames == [frames(rows("a")), frames(rows("c"), rows("d"))]
    assert gate.finish_capture(2).frames == [
        frames(rows("a"), rows("b")),
        frames(rows("c"), rows("d"), rows("e")),
    ]


def test_drop_capture_stops_recording_and_forgets_it() -> None:
    gate = OvertakingInputGate(2)
    gate.put(0, overtaking(3))
    gate.take(0)
    gate.start_capture(3)
    gate.put(1, rows(1))
    gate.drop_capture(3)
    gate.put(1, rows(2))
    with pytest.raises(KeyError, match="checkpoint 3"):
        gate.finish_capture(3)
    gate.drop_capture(3)  # dropping twice is harmless (abort after abort)


def test_finish_capture_of_an_unknown_checkpoint_is_a_key_error() -> None:
    gate = OvertakingInputGate(1)
    with pytest.raises(KeyError, match="no channel state is being recorded for checkpoint 8"):
        gate.finish_capture(8)


# ---------------------------------------------------------------- aligned timeout


def test_aligned_barrier_with_a_timeout_waits_in_line_with_its_deadline() -> None:
    gate = OvertakingInputGate(2)
    assert gate.next_deadline() is None
    gate.put(0, rows(1))
    gate.put(0, timed(3, 0.5))
    gate.put(1, timed(3, 0.5))
    assert gate.next_deadline() == pytest.approx(T0 + 0.5)
    assert gate.due(T0 + 0.4) == []
    assert gate.due(T0 + 0.5) == [3]
    taken = take_all(gate)
    assert [item for ch, item in taken if ch == 0] == [rows(1), timed(3, 0.5)]


def test_promote_sends_the_queued_copies_ahead_and_skips_their_place() -> None:
    gate = OvertakingInputGate(2)
    gate.put(0, rows(1))
    gate.put(0, timed(3))
    gate.put(0, rows(2))
    gate.promote(3)
    assert gate.next_deadline() is None
    ch, barrier = gate.take(0)  # type: ignore[misc]
    assert ch == 0 and barrier.checkpoint_id == 3 and barrier.overtakes
    assert barrier == timed(3).unaligned_now()
    assert [item for _, item in take_all(gate)] == [rows(1), rows(2)], "tombstone skipped"
    # A copy arriving after the promotion overtakes on arrival.
    gate.put(1, rows(5))
    gate.put(1, timed(3))
    assert gate.take(0) == (1, timed(3).unaligned_now())
    assert gate.take(0) == (1, rows(5))


def test_promoted_checkpoint_captures_the_data_before_its_cut() -> None:
    gate = OvertakingInputGate(2)
    gate.put(0, rows(1))
    gate.put(0, timed(3))
    gate.put(0, rows(2))
    gate.promote(3)
    gate.take(0)
    gate.start_capture(3)
    gate.put(1, rows(7))
    gate.put(1, timed(3))
    assert gate.finish_capture(3).frames == [frames(rows(1)), frames(rows(7))]


def test_promote_skips_a_copy_the_task_already_took() -> None:
    gate = OvertakingInputGate(2)
    gate.put(0, timed(3))
    gate.put(1, rows(1))
    gate.put(1, timed(3))
    assert gate.take(0) == (0, timed(3))
    gate.blocked[0] = True  # the handler blocks channel 0 while aligning
    gate.promote(3)
    assert gate.take(0) == (1, timed(3).unaligned_now()), "only channel 1's copy goes ahead"
    gate.blocked[0] = False
    assert take_all(gate) == [(1, rows(1))]


def test_promote_leaves_a_channel_whose_copy_already_overtook_alone() -> None:
    # Channel 0's upstream switched to unaligned first and forwarded an overtaking copy;
    # channel 1's copy still waits in line, with the deadline the gate promotes at.
    gate = OvertakingInputGate(2)
    gate.put(0, timed(3).unaligned_now())
    gate.put(0, rows("after the barrier"))
    gate.put(1, rows("before the barrier"))
    gate.put(1, timed(3))
    assert gate.take(0) == (0, timed(3).unaligned_now())
    gate.promote(3)
    assert gate.take(0) == (1, timed(3).unaligned_now())
    taken = take_all(gate)
    assert sorted(item.records[0] for _, item in taken) == [
        "after the barrier",
        "before the barrier",
    ], "no record is lost to the promotion"


def test_settle_forgets_the_deadlines_of_settled_checkpoints() -> None:
    gate = OvertakingInputGate(1)
    gate.put(0, timed(2, 0.5))
    gate.put(0, timed(3, 1.0))
    gate.settle(2)
    assert gate.next_deadline() == pytest.approx(T0 + 1.0)
    assert gate.due(T0 + 5.0) == [3]


# ---------------------------------------------------------------- credit


class CreditLog:
    """A fake network sender: the credit the gate returned, in order."""

    def __init__(self) -> None:
        self.grants: list[int] = []

    def __call__(self, credit: int) -> None:
        self.grants.append(credit)


def test_attach_credit_grants_the_capacity_then_returns_credit_in_batches() -> None:
    gate = OvertakingInputGate(2, capacity=4)
    sender = CreditLog()
    gate.attach_credit(0, sender)
    assert sender.grants == [4]
    for i in range(5):
        gate.put(0, rows(i))
    gate.put(1, rows("other"))  # a channel without credit returns none
    taken = []
    for _ in range(6):
        taken.append(gate.take(0))
    assert len(taken) == 6
    assert sender.grants == [4] + [CREDIT_BATCH] * (5 // CREDIT_BATCH)


def test_barriers_and_skipped_places_return_no_credit() -> None:
    gate = OvertakingInputGate(1, capacity=4)
    sender = CreditLog()
    gate.attach_credit(0, sender)
    gate.put(0, rows(1))
    gate.put(0, timed(1))  # in line, then promoted: its place is skipped
    gate.promote(1)
    gate.put(0, overtaking(2))
    gate.put(0, timed(3))  # in line, taken as it is
    gate.put(0, rows(2))
    gate.put(0, rows(3))
    gate.put(0, END_OF_INPUT)  # events take credit like data
    taken = [item for _, item in take_all(gate)]
    assert taken == [
        timed(1).unaligned_now(),
        overtaking(2),
        rows(1),
        timed(3),
        rows(2),
        rows(3),
        END_OF_INPUT,
    ]
    # Four items took credit (three batches and the event), none of the barriers.
    assert sender.grants == [4] + [CREDIT_BATCH] * (4 // CREDIT_BATCH)
