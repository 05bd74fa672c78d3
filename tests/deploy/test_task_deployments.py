"""What each task of an attempt is given: initial splits, restored state, checkpoint id."""

from __future__ import annotations

from typing import Any

import pytest

import epochstream as es
from epochstream.checkpoint.metadata import CheckpointMetadata
from epochstream.checkpoint.pending import CompletedCheckpoint
from epochstream.connectors.base import Source, SourceContext, SourceReader
from epochstream.core.checkpoint_stats import CheckpointStats
from epochstream.deploy.assignment import initial_splits, task_deployments
from epochstream.exceptions import StateError
from epochstream.graph.jobgraph import ChainSpec, JobGraph
from epochstream.runtime.messages import TaskDeployment
from epochstream.state.handles import HeapSnapshotHandle, HeapStateFile, OperatorSubtaskState
from epochstream.state.keygroups import key_group_range_for_operator

MAX_P = 128


class FixedSplits(Source):
    """A source that always makes ``count`` splits named ``<name>-<k>``, whatever the
    parallelism (only its splits matter here, it is never read)."""

    def __init__(self, name: str, count: int) -> None:
        self.name = name
        self.count = count

    def create_splits(self, parallelism: int) -> list[str]:
        return [f"{self.name}-{k}" for k in range(self.count)]

    def create_reader(self, ctx: SourceContext) -> SourceReader:
        raise NotImplementedError


def _add(a: Any, b: Any) -> Any:
    return a + b


def _graph(parallelism: int, *, with_second_source: bool = False) -> JobGraph:
    """src(7 splits) -> map -(hash)-> sums -> out, optionally unioned with src2(3 splits)."""
    env = es.Environment(parallelism=parallelism, runner="local", max_parallelism=MAX_P)
    stream = env.from_source(FixedSplits("a", 7)).uid("src").map(lambda i: i).uid("m")
    if with_second_source:
        stream = stream.union(env.from_source(FixedSplits("b", 3)).uid("src2"))
    sums = stream.key_by(lambda i: i % 4).reduce(_add).uid("sums")
    sums.sink_to(es.sinks.DiscardSink()).uid("out")
    return env.job_graph("assign")


def _chain_of(graph: JobGraph, uid: str) -> ChainSpec:
    return next(c for c in graph.chains if uid in {op.uid for op in c.operators})


def _deployment(
    slots: dict[int, list[TaskDeployment]], subtask: int, chain: ChainSpec
) -> TaskDeployment:
    (found,) = [d for d in slots[subtask] if d.chain_id == chain.chain_id]
    return found


# ---------------------------------------------------------------- fresh start


@pytest.mark.parametrize("parallelism", [1, 3, 4, 9])
def test_split_k_goes_to_subtask_k_mod_p(parallelism: int) -> None:
    graph = _graph(parallelism)
    src = _chain_of(graph, "src")
    splits = initial_splits(graph)
    assert set(splits) == {src.chain_id}, "only source chains get splits"
    per_subtask = splits[src.chain_id]
    assert len(per_subtask) == parallelism
    for i, mine in enumerate(per_subtask):
        assert mine == [f"a-{k}" for k in range(7) if k % parallelism == i]


def test_every_source_chain_gets_its_own_splits() -> None:
    graph = _graph(2, with_second_source=True)
    splits = initial_splits(graph)
    a, b = _chain_of(graph, "src"), _chain_of(graph, "src2")
    assert splits == {
        a.chain_id: [["a-0", "a-2", "a-4", "a-6"], ["a-1", "a-3", "a-5"]],
        b.chain_id: [["b-0", "b-2"], ["b-1"]],
    }


def test_fresh_start_deploys_every_chain_in_every_slot_with_its_splits() -> None:
    graph = _graph(3)
    splits = initial_splits(graph)
    slots = task_deployments(graph, None, splits)
    assert sorted(slots) == [0, 1, 2]
    src = _chain_of(graph, "src")
    for i, deployments in slots.items():
        assert [d.chain_id for d in deployments] == [c.chain_id for c in graph.chains]
        for d in deployments:
            assert d.subtask == i
            assert d.restore == {} and d.restored_checkpoint is None
            expected = splits[src.chain_id][i] if d.chain_id == src.chain_id else None
            assert d.splits == expected


# ---------------------------------------------------------------- restore


def _heap_handle(old_parallelism: int, subtask: int) -> HeapSnapshotHandle:
    """A heap handle of an old subtask with one segment in every key group it owned."""
    groups = key_group_range_for_operator(MAX_P, old_parallelism, subtask)
    path = f"/ck/job/shared/4-sums-{subtask}.kst"
    segments = {kg: (10 * n, 10) for n, kg in enumerate(groups)}
    file = HeapStateFile(path, True, segments, 10 * len(groups))
    return HeapSnapshotHandle(groups, (file,), {"_reduce": "value"})


def _checkpoint(
    *,
    owned: bool,
    old_parallelism: int = 2,
    max_parallelism: int = MAX_P,
    extra: dict[str, dict[int, OperatorSubtaskState]] | None = None,
) -> CompletedCheckpoint:
    p = old_parallelism
    operators: dict[str, dict[int, OperatorSubtaskState]] = {
        "src": {
            i: OperatorSubtaskState(operator_lists={"splits": [f"pos-{i}-{j}" for j in range(2)]})
            for i in range(p)
        },
        "sums": {i: OperatorSubtaskState(keyed=_heap_handle(p, i)) for i in range(p)},
        "out": {i: OperatorSubtaskState(union_lists={"txns": [f"txn-{i}"]}) for i in range(p)},
        **(extra or {}),
    }
    metadata = CheckpointMetadata(
        job_id="old-job",
        checkpoint_id=4,
        trigger_time=1.0,
        completion_time=2.0,
        parallelism=p,
        max_parallelism=max_parallelism,
        operators=operators,
        operator_parallelism={uid: p for uid in operators},
        stats=CheckpointStats(checkpoint_id=4, trigger_time=1.0, duration=1.0, state_size=0),
    )
    return CompletedCheckpoint(4, "/ck/job/chk-4", metadata, owned=owned)


@pytest.mark.parametrize("owned", [True, False])
@pytest.mark.parametrize("new_parallelism", [1, 2, 3, 5])
def test_restore_redistributes_state_to_the_new_parallelism(
    owned: bool, new_parallelism: int
) -> None:
    graph = _graph(new_parallelism)
    restored = _checkpoint(owned=owned)
    slots = task_deployments(graph, restored, initial_splits(graph))
    src, sums = _chain_of(graph, "src"), _chain_of(graph, "sums")
    all_segments: dict[int, tuple[int, int]] = {}
    positions: list[Any] = []
    for i in range(new_parallelism):
        source_task = _deployment(slots, i, src)
        assert source_task.splits is None, "a restored source reads its checkpointed positions"
        assert set(source_task.restore) == {"src"}, "the chained map has no state to restore"
        positions += source_task.restore["src"].operator_lists.get("splits", [])

        keyed_task = _deployment(slots, i, sums)
        assert set(keyed_task.restore) == {"sums", "out"}
        mine = key_group_range_for_operator(MAX_P, new_parallelism, i)
        handles = keyed_task.restore["sums"].keyed
        assert handles, f"subtask {i} owns key groups that hold state"
        for handle in handles:
            assert isinstance(handle, HeapSnapshotHandle)
            for file in handle.chain:
                assert set(file.segments) <= set(mine), "only this subtask's key groups"
                assert not set(file.segments) & set(all_segments), "each group goes once"
                all_segments.update(file.segments)
        assert keyed_task.restore["out"].union_lists == {"txns": ["txn-0", "txn-1"]}

        for d in slots[i]:
            assert d.restored_checkpoint == 4
            assert all(r.owned is owned for r in d.restore.values())
    assert sorted(all_segments) == list(range(MAX_P)), "every key group is restored somewhere"
    assert sorted(positions) == ["pos-0-0", "pos-0-1", "pos-1-0", "pos-1-1"]


def _groups(handle: Any) -> tuple[range, list[int]]:
    """A heap handle's key-group range and the key groups its (single) file still holds."""
    assert isinstance(handle, HeapSnapshotHandle)
    (file,) = handle.chain
    return handle.key_groups, sorted(file.segments)


def test_rescaled_keyed_handles_are_restricted_or_dropped() -> None:
    graph = _graph(3)  # key groups 0-42, 43-85, 86-127; old subtasks owned 0-63 and 64-127
    slots = task_deployments(graph, _checkpoint(owned=True), initial_splits(graph))
    sums = _chain_of(graph, "sums")
    key_ranges = [
        [_groups(h) for h in _deployment(slots, i, sums).restore["sums"].keyed] for i in range(3)
    ]
    assert key_ranges == [
        [(range(0, 64), list(range(0, 43)))],
        [(range(0, 64), list(range(43, 64))), (range(64, 128), list(range(64, 86)))],
        [(range(64, 128), list(range(86, 128)))],
    ]


def test_a_source_new_to_the_job_starts_from_its_initial_splits() -> None:
    graph = _graph(2, with_second_source=True)
    splits = initial_splits(graph)
    slots = task_deployments(graph, _checkpoint(owned=False), splits)
    a, b = _chain_of(graph, "src"), _chain_of(graph, "src2")
    for i in range(2):
        assert _deployment(slots, i, a).splits is None
        new = _deployment(slots, i, b)
        assert new.splits == splits[b.chain_id][i] and new.restore == {}
        assert new.restored_checkpoint == 4


def test_state_of_operators_the_job_lacks_is_left_out() -> None:
    graph = _graph(2)
    gone = {"gone": {0: OperatorSubtaskState(operator_lists={"x": [1]})}}
    slots = task_deployments(graph, _checkpoint(owned=True, extra=gone), initial_splits(graph))
    restored_uids = {uid for ds in slots.values() for d in ds for uid in d.restore}
    assert restored_uids == {"src", "sums", "out"}


def test_old_parallelism_defaults_to_the_checkpoint_parallelism() -> None:
    graph = _graph(2)
    restored = _checkpoint(owned=True, old_parallelism=2)
    restored.metadata.operator_parallelism.clear()
    slots = task_deployments(graph, restored, initial_splits(graph))
    src = _chain_of(graph, "src")
    assert _deployment(slots, 1, src).restore["src"].operator_lists == {
        "splits": ["pos-1-0", "pos-1-1"]
    }, "same parallelism: each subtask keeps its own positions"


def test_a_checkpoint_with_another_max_parallelism_is_refused() -> None:
    graph = _graph(2)
    with pytest.raises(StateError, match="max_parallelism 256, the job 128"):
        task_deployments(graph, _checkpoint(owned=True, max_parallelism=256), initial_splits(graph))
