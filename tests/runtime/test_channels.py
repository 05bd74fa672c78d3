"""Input gate: FIFO channels, blocking by the barrier handler, mail first, backpressure."""

from __future__ import annotations

import threading
import time

import pytest

from epochstream.runtime.channels import MAIL, Cancelled, InputGate


def test_fifo_per_channel_and_round_robin() -> None:
    gate = InputGate(2)
    for i in range(3):
        gate.put(0, [f"a{i}"])
        gate.put(1, [f"b{i}"])
    taken = [gate.take(0) for _ in range(6)]
    by_channel: dict[int, list] = {0: [], 1: []}
    for ch, item in taken:
        by_channel[ch].append(item[0])
    assert by_channel == {0: ["a0", "a1", "a2"], 1: ["b0", "b1", "b2"]}
    assert [ch for ch, _ in taken[:2]] in ([0, 1], [1, 0])
    assert gate.take(0) is None


def test_blocked_channel_is_not_read_until_unblocked() -> None:
    gate = InputGate(2)
    gate.put(0, ["x"])
    gate.put(1, ["y"])
    gate.blocked[0] = True
    assert gate.take(0) == (1, ["y"])
    assert gate.take(0) is None
    gate.blocked[0] = False
    assert gate.take(0) == (0, ["x"])


def test_mail_comes_before_input() -> None:
    gate = InputGate(1)
    gate.put(0, [1])
    gate.put_mail("trigger")
    assert gate.take(0) == (MAIL, "trigger")
    assert gate.take(0) == (0, [1])


def test_full_channel_blocks_producer_until_consumed() -> None:
    gate = InputGate(1, capacity=2)
    gate.put(0, [1])
    gate.put(0, [2])
    done = threading.Event()

    def producer() -> None:
        gate.put(0, [3])
        done.set()

    threading.Thread(target=producer, daemon=True).start()
    assert not done.wait(0.2), "producer should block on a full channel (backpressure)"
    assert gate.take(0) == (0, [1])
    assert done.wait(2)
    assert [gate.take(0)[1] for _ in range(2)] == [[2], [3]]


def test_cancel_wakes_producer_and_consumer() -> None:
    gate = InputGate(1, capacity=1)
    gate.put(0, [1])
    errors: list[BaseException] = []

    def producer() -> None:
        try:
            gate.put(0, [2])
        except Cancelled as exc:
            errors.append(exc)

    t = threading.Thread(target=producer, daemon=True)
    t.start()
    time.sleep(0.05)
    gate.cancel()
    t.join(2)
    assert errors and isinstance(errors[0], Cancelled)
    with pytest.raises(Cancelled):
        gate.take(None)


def test_take_times_out() -> None:
    gate = InputGate(1)
    start = time.monotonic()
    assert gate.take(0.05) is None
    assert time.monotonic() - start >= 0.04
