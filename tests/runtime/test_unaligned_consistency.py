"""The overtaking input gate and the barrier handler together, as a task drives them:
every checkpoint's cut is exact.

For a checkpoint ``n`` that completes, on every channel, the records the task processed
before ``n``'s snapshot followed by the records recorded as its channel state are exactly
the records put on that channel before barrier ``n``: nothing lost, nothing twice, nothing
from after the barrier. An aligned checkpoint records nothing: the task processed them all.
Random interleavings of producers, the task, alignment timeouts and coordinator aborts.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from epochstream.core.clock import ManualClock
from epochstream.core.events import END_OF_INPUT, CheckpointBarrier, CheckpointOptions, EndOfInput
from epochstream.runtime.barriers import (
    AbortAlignment,
    Action,
    BarrierHandler,
    ChannelStateComplete,
    EndOfAllInputs,
    HandlerState,
    TriggerSnapshot,
)
from epochstream.runtime.batches import RowBatch
from epochstream.runtime.overtaking_gate import OvertakingInputGate

#: Options of the copies of a barrier: overtaking (unaligned from the start), aligned with
#: a timeout (in line until the gate promotes it), aligned (a savepoint).
OVERTAKING = CheckpointOptions(unaligned=True)
TIMED = CheckpointOptions(unaligned=True, aligned_timeout=1.0)
ALIGNED = CheckpointOptions()


@dataclass
class Task:
    """A task reading one gate: what it processed, and what each checkpoint saw."""

    gate: OvertakingInputGate
    handler: BarrierHandler
    #: Per channel, the records processed so far (in order).
    processed: list[list[Any]]
    #: Per checkpoint that triggered, the records processed per channel at its snapshot.
    snapshots: dict[int, list[list[Any]]] = field(default_factory=dict)
    unaligned: set[int] = field(default_factory=set)
    #: Per checkpoint whose channel state completed, its records per channel.
    channel_state: dict[int, list[list[Any]]] = field(default_factory=dict)
    aligned_done: set[int] = field(default_factory=set)
    ended: bool = False

    def execute(self, actions: list[Action]) -> None:
        for action in actions:
            assert not self.ended, f"{action} after the end of every input"
            if isinstance(action, TriggerSnapshot):
                n = action.checkpoint_id
                assert n not in self.snapshots, f"checkpoint {n} triggered twice"
                self.snapshots[n] = [list(records) for records in self.processed]
                if action.unaligned:
                    self.unaligned.add(n)
                    self.gate.start_capture(n)
                else:
                    self.gate.settle(n)
                    self.aligned_done.add(n)
            elif isinstance(action, ChannelStateComplete):
                capture = self.gate.finish_capture(action.checkpoint_id)
                self.channel_state[action.checkpoint_id] = [
                    [record for frame in frames for record in pickle.loads(frame).records]
                    for frames in capture.frames
                ]
            elif isinstance(action, AbortAlignment):
                self.gate.drop_capture(action.checkpoint_id)
            else:
                assert isinstance(action, EndOfAllInputs)
                self.ended = True

    def step(self) -> bool:
        """Take and process one item; False when there was none to take."""
        got = self.gate.take(0)
        if got is None:
            return False
        ch, item = got
        if type(item) is RowBatch:
            self.processed[ch].extend(item.records)
        elif type(item) is CheckpointBarrier:
            self.execute(self.handler.on_barrier(ch, item.checkpoint_id, overtakes=item.overtakes))
        else:
            assert type(item) is EndOfInput
            self.execute(self.handler.on_end_of_input(ch))
        return True

    def alignment_timeout(self) -> None:
        """What the task does when the gate says deadlines passed (``_take_overtaking``)."""
        for n in self.gate.due(float("inf")):
            self.gate.promote(n)
            self.execute(self.handler.on_alignment_timeout(n))


def _script(data: st.DataObject, ch: int, kinds: dict[int, str]) -> list[Any]:
    """Channel ``ch``'s items: records, a copy of most barriers, the end."""
    items: list[Any] = []
    seq = 0
    for n, kind in sorted(kinds.items()):
        for _ in range(data.draw(st.integers(0, 3))):
            items.append(RowBatch([(ch, seq)]))
            seq += 1
        if data.draw(st.integers(0, 4)) == 0:
            continue  # its upstream aborted checkpoint n: this channel never carries it
        if kind == "timed":  # this copy's upstream may have switched to unaligned already
            options = data.draw(st.sampled_from([TIMED, TIMED, OVERTAKING]))
        else:
            options = OVERTAKING if kind == "overtaking" else ALIGNED
        items.append(CheckpointBarrier(n, 0.0, options))
    for _ in range(data.draw(st.integers(0, 3))):
        items.append(RowBatch([(ch, seq)]))
        seq += 1
    items.append(END_OF_INPUT)
    return items


def _before(script: list[Any], n: int) -> list[Any]:
    """The records of ``script`` before barrier ``n``: all of them when it never comes."""
    records: list[Any] = []
    for item in script:
        if type(item) is CheckpointBarrier and item.checkpoint_id == n:
            break
        if type(item) is RowBatch:
            records.extend(item.records)
    return records


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    # No explain phase: on a failure it replays thousands of variants (minutes).
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
)
@given(st.data())
def test_every_completed_checkpoint_cuts_every_channel_exactly(data: st.DataObject) -> None:
    num_channels = data.draw(st.integers(1, 3))
    k = data.draw(st.integers(1, 4))
    kinds = {
        n: data.draw(st.sampled_from(["overtaking", "timed", "aligned"])) for n in range(1, k + 1)
    }
    scripts = [_script(data, ch, kinds) for ch in range(num_channels)]
    gate = OvertakingInputGate(num_channels, capacity=4)
    handler = BarrierHandler(num_channels=num_channels, exactly_once=True, clock=ManualClock())
    gate.blocked = handler.blocked
    task = Task(gate, handler, [[] for _ in range(num_channels)])
    put = [0] * num_channels

    while not task.ended:
        producers = [ch for ch in range(num_channels) if put[ch] < len(scripts[ch])]
        move = data.draw(st.sampled_from(["put", "put", "take", "take", "timeout", "abort"]))
        if move == "put" and producers:
            ch = data.draw(st.sampled_from(producers))
            gate.put(ch, scripts[ch][put[ch]])
            put[ch] += 1
        elif move == "timeout":
            task.alignment_timeout()
        elif move == "abort":
            task.execute(handler.on_abort(data.draw(st.integers(1, k))))
        elif not task.step() and not producers:
            # Nothing to put or take: only a timeout or an abort can free the gate.
            assert handler.pending_checkpoint is not None, f"the gate is stuck: {handler!r}"

    assert handler.state is HandlerState.CLOSED
    for n, state in task.channel_state.items():
        seen = task.snapshots[n]
        for ch in range(num_channels):
            expected = _before(scripts[ch], n)
            assert seen[ch] + state[ch] == expected, (
                f"checkpoint {n}, channel {ch}: processed {seen[ch]} + channel state "
                f"{state[ch]} != records before its barrier {expected}"
            )
    for n in task.aligned_done:
        for ch in range(num_channels):
            assert task.snapshots[n][ch] == _before(scripts[ch], n), f"aligned {n}, channel {ch}"
    assert set(task.channel_state) <= task.unaligned
