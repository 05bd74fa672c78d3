"""Which restoring task replays which channel state of an unaligned checkpoint, at the same
parallelism and rescaled, per edge kind; and the channel state that cannot be restored."""

from __future__ import annotations

import pytest

import epochstream as es
from epochstream.checkpoint.metadata import CheckpointMetadata
from epochstream.checkpoint.pending import CompletedCheckpoint
from epochstream.core.checkpoint_stats import CheckpointStats
from epochstream.deploy.assignment import (
    channel_state_restores,
    initial_splits,
    task_deployments,
)
from epochstream.deploy.upgrade_check import check_upgrade
from epochstream.exceptions import StateError
from epochstream.graph.jobgraph import JobEdge, JobGraph
from epochstream.state.channel_state import (
    INPUT,
    OUTPUT,
    ChannelRestore,
    ChannelStateEntry,
    ChannelStateHandle,
)
from epochstream.state.handles import OperatorSubtaskState

DIRECTORY = "/ck/job/chk-3"
OLD_P = 2


def job_graph(kind: str, parallelism: int) -> JobGraph:
    """``src -> mid`` (one chain), then an edge of ``kind`` to ``down`` (and a sink)."""
    return job(kind, parallelism).job_graph()


def job(kind: str, parallelism: int) -> es.Environment:
    """The environment of :func:`job_graph`'s job."""
    env = es.Environment(parallelism=parallelism)
    mid = env.from_sequence(0, 10).uid("src").map(lambda x: x).uid("mid")
    if kind == "hash":
        down = mid.key_by(lambda x: x % 3).sum().uid("down")
    elif kind == "rebalance":
        down = mid.rebalance().map(str).uid("down")
    elif kind == "broadcast":
        down = mid.broadcast().map(str).uid("down")
    else:  # a union's inputs are unchained forward edges
        other = env.from_sequence(0, 5).uid("other")
        down = mid.union(other).map(str).uid("down")
    down.print()
    return env


def the_edge(graph: JobGraph) -> JobEdge:
    [edge] = [e for e in graph.edges if e.source_uid == "mid"]
    return edge


def handle(subtask: int, *entries: tuple[str, str, int]) -> ChannelStateHandle:
    """Old subtask ``subtask``'s channel state file of (direction, edge key, channel)."""
    return ChannelStateHandle(
        path=f"{DIRECTORY}/channels-{subtask}",
        size=10 * len(entries),
        entries=tuple(
            ChannelStateEntry(d, edge, ch, ((10 * i, 10),))
            for i, (d, edge, ch) in enumerate(entries)
        ),
        crc=subtask,
    )


def metadata(states: dict[str, dict[int, ChannelStateHandle]]) -> CheckpointMetadata:
    return CheckpointMetadata(
        job_id="job",
        checkpoint_id=3,
        trigger_time=1.0,
        completion_time=2.0,
        parallelism=OLD_P,
        max_parallelism=128,
        operators={
            uid: {i: OperatorSubtaskState(channel=h) for i, h in handles.items()}
            for uid, handles in states.items()
        },
        operator_parallelism=dict.fromkeys(states, OLD_P),
        stats=CheckpointStats(checkpoint_id=3, trigger_time=1.0, duration=1.0, state_size=0),
    )


def input_state(graph: JobGraph) -> tuple[CheckpointMetadata, list[ChannelStateHandle]]:
    """Both old ``down`` subtasks hold input frames of the edge (from upstream 1 and 0)."""
    edge = the_edge(graph)
    key = graph.edge_key(edge)
    head = graph.chain(edge.target_chain).head.uid
    handles = [handle(0, (INPUT, key, 1)), handle(1, (INPUT, key, 0))]
    return metadata({head: dict(enumerate(handles))}), handles


def output_state(graph: JobGraph) -> tuple[CheckpointMetadata, list[ChannelStateHandle]]:
    """Both old ``mid`` subtasks hold output frames of the edge (to downstream 1 and 0)."""
    key = graph.edge_key(the_edge(graph))
    handles = [handle(0, (OUTPUT, key, 1)), handle(1, (OUTPUT, key, 0))]
    return metadata({"src": dict(enumerate(handles))}), handles


def restore(h: ChannelStateHandle, reroute: bool) -> ChannelRestore:
    return ChannelRestore(h, h.entries[0], reroute)


# ---------------------------------------------------------------- input frames


@pytest.mark.parametrize("kind", ["hash", "rebalance", "forward", "broadcast"])
def test_same_parallelism_input_goes_back_to_its_subtask(kind: str) -> None:
    graph = job_graph(kind, OLD_P)
    md, (h0, h1) = input_state(graph)
    down = the_edge(graph).target_chain
    assert channel_state_restores(graph, md, DIRECTORY) == {
        (down, 0): [restore(h0, False)],
        (down, 1): [restore(h1, False)],
    }


@pytest.mark.parametrize("new_p", [3, 1])
def test_rescaled_hash_input_goes_to_every_subtask_to_keep_its_key_groups(new_p: int) -> None:
    graph = job_graph("hash", new_p)
    md, (h0, h1) = input_state(graph)
    down = the_edge(graph).target_chain
    assert channel_state_restores(graph, md, DIRECTORY) == {
        (down, i): [restore(h0, True), restore(h1, True)] for i in range(new_p)
    }


@pytest.mark.parametrize("kind", ["rebalance", "forward"])
def test_rescaled_input_of_other_edges_goes_round_robin_unfiltered(kind: str) -> None:
    graph = job_graph(kind, 3)
    md, (h0, h1) = input_state(graph)
    down = the_edge(graph).target_chain
    assert channel_state_restores(graph, md, DIRECTORY) == {
        (down, 0): [restore(h0, False)],
        (down, 1): [restore(h1, False)],
    }
    graph = job_graph(kind, 1)
    down = the_edge(graph).target_chain
    assert channel_state_restores(graph, md, DIRECTORY) == {
        (down, 0): [restore(h0, False), restore(h1, False)],
    }


# ---------------------------------------------------------------- output frames


@pytest.mark.parametrize("kind", ["hash", "rebalance", "forward", "broadcast"])
def test_same_parallelism_output_goes_back_to_its_subtask(kind: str) -> None:
    graph = job_graph(kind, OLD_P)
    md, (h0, h1) = output_state(graph)
    mid = the_edge(graph).source_chain
    assert channel_state_restores(graph, md, DIRECTORY) == {
        (mid, 0): [restore(h0, False)],
        (mid, 1): [restore(h1, False)],
    }


@pytest.mark.parametrize("kind", ["hash", "rebalance", "forward"])
def test_rescaled_output_is_rerouted_by_the_upstream_subtask_that_kept_it(kind: str) -> None:
    graph = job_graph(kind, 3)
    md, (h0, h1) = output_state(graph)
    mid = the_edge(graph).source_chain
    assert channel_state_restores(graph, md, DIRECTORY) == {
        (mid, 0): [restore(h0, True)],
        (mid, 1): [restore(h1, True)],
    }
    graph = job_graph(kind, 1)
    assert channel_state_restores(graph, md, DIRECTORY) == {
        (mid, 0): [restore(h0, True), restore(h1, True)],
    }


def test_a_task_replays_its_inputs_and_outputs_of_several_edges() -> None:
    env = es.Environment(parallelism=OLD_P)
    numbers = env.from_sequence(0, 10).uid("src")
    numbers.rebalance().map(lambda x: x * 2).uid("mid").key_by(lambda n: n % 3).sum().uid(
        "down"
    ).print()
    graph = env.job_graph()
    into_mid, out_of_mid = graph.edges
    h = handle(
        1,
        (INPUT, graph.edge_key(into_mid), 0),
        (OUTPUT, graph.edge_key(out_of_mid), 1),
    )
    md = metadata({"mid": {1: h}})
    assert channel_state_restores(graph, md, DIRECTORY) == {
        (into_mid.target_chain, 1): [
            ChannelRestore(h, h.entries[0], False),
            ChannelRestore(h, h.entries[1], False),
        ]
    }


# ---------------------------------------------------------------- refused


@pytest.mark.parametrize("new_p", [3, 1])
@pytest.mark.parametrize("state", [input_state, output_state])
def test_broadcast_channel_state_cannot_be_rescaled(state, new_p: int) -> None:
    graph = job_graph("broadcast", new_p)
    md, _ = state(graph)
    with pytest.raises(StateError, match="broadcast edge") as info:
        channel_state_restores(graph, md, DIRECTORY)
    message = str(info.value)
    assert DIRECTORY in message and graph.edge_key(the_edge(graph)) in message
    assert f"from parallelism {OLD_P} to {new_p}" in message


def test_channel_state_of_an_edge_the_job_does_not_have_is_refused() -> None:
    graph = job_graph("hash", OLD_P)
    md = metadata({"down": {0: handle(0, (INPUT, "gone[main] -> down #0", 0))}})
    with pytest.raises(StateError, match=r"edge gone\[main\] -> down #0, which this job does not"):
        channel_state_restores(graph, md, DIRECTORY)


def test_no_channel_state_no_restores() -> None:
    graph = job_graph("hash", 3)
    md = metadata({})
    md.operators["down"] = {0: OperatorSubtaskState(operator_lists={"x": [1]})}
    assert channel_state_restores(graph, md, DIRECTORY) == {}


def test_task_deployments_carry_each_tasks_channel_state() -> None:
    graph = job_graph("hash", 3)
    md, (h0, h1) = input_state(graph)
    point = CompletedCheckpoint(3, DIRECTORY, md, owned=False)
    slots = task_deployments(graph, point, initial_splits(graph))
    down = the_edge(graph).target_chain
    for subtask, deployments in slots.items():
        for deployment in deployments:
            if deployment.chain_id == down:
                assert deployment.channel_state == [restore(h0, True), restore(h1, True)]
            else:
                assert deployment.channel_state == [], deployment.chain_id
            assert deployment.subtask == subtask


# ---------------------------------------------------------------- check-upgrade


def test_check_upgrade_reports_channel_state_the_restore_would_refuse() -> None:
    graph = job_graph("broadcast", OLD_P)
    md, _ = input_state(graph)
    point = CompletedCheckpoint(3, DIRECTORY, md, owned=False)
    description = job("broadcast", 3).job_description("j")
    report = check_upgrade(description, point)
    assert not report.ok
    assert any("broadcast edge" in error for error in report.errors), report.errors


def test_check_upgrade_reports_channel_state_of_an_edge_the_job_lost() -> None:
    md = metadata({"down": {0: handle(0, (INPUT, "gone[main] -> down #0", 0))}})
    point = CompletedCheckpoint(3, DIRECTORY, md, owned=False)
    report = check_upgrade(job("hash", OLD_P).job_description("j"), point)
    assert not report.ok
    assert any("gone[main] -> down #0" in error for error in report.errors), report.errors
