"""Output channels of unaligned checkpoints: a credited network channel over a real
loopback connection (credit, overtaking barriers, the frames they overtook, a broken
peer), and a local channel into an overtaking gate."""

from __future__ import annotations

import pickle
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from epochstream.core.events import (
    END_OF_INPUT,
    CheckpointBarrier,
    CheckpointOptions,
    EndOfInput,
    Watermark,
)
from epochstream.runtime.auth import FramedConnection
from epochstream.runtime.batches import RowBatch
from epochstream.runtime.frames import FrameEncoder, decode_frame
from epochstream.runtime.overtaking_channels import (
    OUTPUT_QUEUE_LIMIT,
    CreditedNetworkChannel,
    OvertakingLocalChannel,
)
from epochstream.runtime.overtaking_gate import OvertakingInputGate

EDGE = "map[main] -> sum #0"


def overtaking(checkpoint_id: int) -> CheckpointBarrier:
    return CheckpointBarrier(checkpoint_id, 1.0, CheckpointOptions(unaligned=True))


def in_line(checkpoint_id: int) -> CheckpointBarrier:
    return CheckpointBarrier(checkpoint_id, 1.0)


def rows(*records: Any) -> RowBatch:
    return RowBatch(list(records))


def frame(item: Any) -> bytes:
    return FrameEncoder().encode(item)


class Receiver:
    """The downstream end of a data connection: reads frames, hands out credit."""

    def __init__(self, conn: FramedConnection) -> None:
        self.conn = conn

    def grant(self, credit: int) -> None:
        self.conn.send_bytes(credit.to_bytes(4, "big"))

    def next(self) -> Any:
        return decode_frame(self.conn.recv_bytes(), pickle.loads)


@pytest.fixture
def link() -> Iterator[tuple[CreditedNetworkChannel, Receiver]]:
    listener = socket.create_server(("127.0.0.1", 0))
    sender = FramedConnection(socket.create_connection(listener.getsockname()))
    receiver = FramedConnection(listener.accept()[0])
    channel = CreditedNetworkChannel(sender, EDGE)
    try:
        yield channel, Receiver(receiver)
    finally:
        channel.close()
        receiver.close()
        listener.close()


def test_nothing_is_sent_without_credit(link) -> None:
    channel, receiver = link
    channel.send(rows(1))
    # A barrier needs no credit: were the batch sent, it would arrive first.
    assert channel.send_barrier(overtaking(1)) == [frame(rows(1))]
    assert receiver.next() == overtaking(1)
    receiver.grant(1)
    assert receiver.next() == rows(1)


def test_n_credits_send_n_frames(link) -> None:
    channel, receiver = link
    for i in range(5):
        channel.send(rows(i))
    receiver.grant(3)
    assert [receiver.next() for _ in range(3)] == [rows(0), rows(1), rows(2)]
    # Credit is spent: the barrier, sent now, comes before the two left.
    assert channel.send_barrier(overtaking(1)) == [frame(rows(3)), frame(rows(4))]
    assert receiver.next() == overtaking(1)
    receiver.grant(2)
    assert [receiver.next() for _ in range(2)] == [rows(3), rows(4)]


def test_events_take_credit_like_data(link) -> None:
    channel, receiver = link
    channel.send(Watermark(5))
    channel.send(rows(1))
    receiver.grant(1)
    assert receiver.next() == Watermark(5)
    channel.send_barrier(overtaking(2))
    assert receiver.next() == overtaking(2), "the batch waits for credit"


def test_overtaking_barrier_returns_the_data_frames_it_overtook_not_the_events(link) -> None:
    channel, receiver = link
    channel.send(rows("a"))
    channel.send(Watermark(7))
    channel.send(rows("b"))
    overtaken = channel.send_barrier(overtaking(4))
    assert overtaken == [frame(rows("a")), frame(rows("b"))]
    assert receiver.next() == overtaking(4)
    receiver.grant(3)
    # The overtaken frames are still sent (they are also output channel state).
    assert [receiver.next() for _ in range(3)] == [rows("a"), Watermark(7), rows("b")]


def test_two_overtaking_barriers_keep_their_order(link) -> None:
    channel, receiver = link
    channel.send(rows("a"))
    assert channel.send_barrier(overtaking(1)) == [frame(rows("a"))]
    channel.send(rows("b"))
    assert channel.send_barrier(overtaking(2)) == [frame(rows("a")), frame(rows("b"))]
    assert [receiver.next() for _ in range(2)] == [overtaking(1), overtaking(2)]
    receiver.grant(2)
    assert [receiver.next() for _ in range(2)] == [rows("a"), rows("b")]


def test_in_line_barrier_waits_behind_the_data_but_needs_no_credit(link) -> None:
    channel, receiver = link
    channel.send(rows(1))
    assert channel.send_barrier(in_line(3)) == [], "an aligned barrier overtakes nothing"
    channel.send(rows(2))
    receiver.grant(1)
    assert [receiver.next() for _ in range(2)] == [rows(1), in_line(3)]
    # The one credit went to the batch, none to the barrier: rows(2) still waits.
    assert channel.send_barrier(overtaking(4)) == [frame(rows(2))]
    assert receiver.next() == overtaking(4)


def test_available_until_the_queue_holds_its_limit(link) -> None:
    channel, receiver = link
    assert channel.available()
    for i in range(OUTPUT_QUEUE_LIMIT - 1):
        channel.send(rows(i))
        assert channel.available()
    channel.send(rows("last"))
    assert not channel.available()
    receiver.grant(OUTPUT_QUEUE_LIMIT)
    for _ in range(OUTPUT_QUEUE_LIMIT):
        receiver.next()
    _wait_for(channel.available)


def test_a_broken_connection_fails_the_next_send(link) -> None:
    channel, receiver = link
    receiver.conn.close()
    error = _send_until_it_fails(channel)
    assert EDGE in str(error) and "broke" in str(error)
    with pytest.raises(ConnectionError, match="broke"):
        channel.send_barrier(overtaking(1))


def test_a_closed_channel_refuses_sends(link) -> None:
    channel, _ = link
    channel.close()
    with pytest.raises(ConnectionError, match=f"channel {re.escape(EDGE)} to .* is closed"):
        channel.send(rows(1))


def _send_until_it_fails(channel: CreditedNetworkChannel) -> ConnectionError:
    """The sender learns of the broken peer on its own threads; a send after that fails."""
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        try:
            channel.send(rows(0))
        except ConnectionError as error:
            return error
        time.sleep(0.01)
    pytest.fail("sends to a closed peer kept succeeding")


def _wait_for(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{condition} stayed false"
        time.sleep(0.01)


# ---------------------------------------------------------------- local channel


def test_local_channel_is_available_while_its_gate_queue_has_room() -> None:
    gate = OvertakingInputGate(2, capacity=2)
    channel = OvertakingLocalChannel(gate, 1)
    channel.send(rows(1))
    assert channel.available()
    channel.send(rows(2))
    assert not channel.available()
    assert OvertakingLocalChannel(gate, 0).available(), "room is per channel"
    assert gate.take(0) == (1, rows(1))
    assert channel.available()


def test_local_channel_barrier_goes_ahead_in_the_gate_and_overtakes_nothing_itself() -> None:
    gate = OvertakingInputGate(2)
    channel = OvertakingLocalChannel(gate, 1)
    channel.send(rows(1))
    # The records it passes stay in the gate's queue: the downstream gate records them.
    assert channel.send_barrier(overtaking(3)) == []
    assert gate.take(0) == (1, overtaking(3))
    gate.start_capture(3)
    assert gate.finish_capture(3).frames == [[], [frame(rows(1))]]
    assert gate.take(0) == (1, rows(1))


# ---------------------------------------------------------------- into an overtaking gate


def _read_into(gate: OvertakingInputGate, conn: FramedConnection) -> threading.Thread:
    """The data plane's reader of one channel (``network.DataPlaneServer``): credit from
    the gate, frames into it with their bytes."""

    def credit(k: int) -> None:
        conn.send_bytes(k.to_bytes(4, "big"))

    def read() -> None:
        gate.attach_credit(0, credit)
        while True:
            payload = conn.recv_bytes()
            item = decode_frame(payload, pickle.loads)
            gate.put(0, item, frame=payload)
            if isinstance(item, EndOfInput):
                return

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_everything_before_the_barrier_is_processed_or_channel_state_once(link) -> None:
    channel, receiver = link
    gate = OvertakingInputGate(1, capacity=4)
    reader = _read_into(gate, receiver.conn)
    sent = [rows(i) for i in range(10)]
    for batch in sent:
        channel.send(batch)
    _wait_for(lambda: not gate.room(0))  # the gate's capacity in credit went out
    processed = [gate.take(5.0)]  # one taken: its credit is owed, not yet returned
    overtaken = channel.send_barrier(overtaking(1))
    # Only mail and overtaking barriers: the barrier, once it came over the socket.
    assert gate.take(5.0, data=False) == (0, overtaking(1))
    gate.start_capture(1)
    capture = gate.finish_capture(1)
    decoded = [pickle.loads(f) for f in capture.frames[0] + overtaken]
    assert [item for _, item in processed] + decoded == sent
    assert [len(capture.frames[0]), len(overtaken)] == [3, 6]
    # The overtaken frames are still delivered, after the barrier, in order.
    rest = [gate.take(5.0) for _ in range(9)]
    assert [item for _, item in rest] == sent[1:]
    channel.send(END_OF_INPUT)
    assert gate.take(5.0) == (0, END_OF_INPUT)
    reader.join(5.0)
    assert not reader.is_alive()
