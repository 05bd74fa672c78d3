"""Split enumerators in the job master (on-demand assignment, pending splits in
checkpoints), global commits."""

from __future__ import annotations

from typing import Any

import pytest

import epochstream as es
from epochstream.checkpoint.metadata import CheckpointMetadata
from epochstream.checkpoint.pending import CompletedCheckpoint
from epochstream.connectors.base import (
    GlobalCommitter,
    Sink,
    SinkContext,
    SinkWriter,
    Source,
    SourceContext,
    SourceReader,
)
from epochstream.connectors.enumerators import SplitEnumerator
from epochstream.core.checkpoint_stats import CheckpointStats
from epochstream.deploy.committers import GlobalCommits
from epochstream.deploy.enumeration import (
    EnumeratorCheckpoint,
    SourceEnumerators,
    restored_enumerator_state,
)
from epochstream.exceptions import ConfigurationError, SinkError
from epochstream.graph.jobgraph import JobGraph
from epochstream.runtime.messages import AddSplits
from epochstream.runtime.operators.connectors import ENUMERATOR, TXNS
from epochstream.state.handles import OperatorSubtaskState


class Growing(SplitEnumerator):
    """Discovers the names in ``arrivals`` (shared with the test) every ``interval``."""

    def __init__(self, arrivals: list[str], restored: Any, interval: float = 1.0) -> None:
        self.arrivals = arrivals
        self.known: set[str] = set(restored or ())
        self.interval = interval
        self.due = 0.0

    def initial_splits(self) -> list[Any]:
        return self.discover(0.0)

    def discover(self, now: float) -> list[Any]:
        self.due = now + self.interval
        new = [a for a in self.arrivals if a not in self.known]
        self.known.update(new)
        return new

    def next_discovery(self) -> float | None:
        return self.due

    def snapshot(self) -> Any:
        return sorted(self.known)


class GrowingSource(Source):
    bounded = False

    def __init__(self, arrivals: list[str]) -> None:
        self.arrivals = arrivals
        self.restored_with: list[Any] = []

    def create_splits(self, parallelism: int) -> list[Any]:
        raise AssertionError("the enumerator makes the splits")

    def create_enumerator(self, parallelism: int, restored: Any) -> SplitEnumerator:
        self.restored_with.append(restored)
        return Growing(self.arrivals, restored)

    def create_reader(self, ctx: SourceContext) -> SourceReader:
        raise NotImplementedError


def _graph(source: Source, parallelism: int = 2, sink: Sink | None = None) -> JobGraph:
    env = es.Environment(parallelism=parallelism, runner="local", max_parallelism=16)
    stream = env.from_source(source).uid("src")
    stream.sink_to(sink or es.sinks.DiscardSink()).uid("out")
    return env.job_graph("enum")


def _checkpoint(
    n: int, operators: dict[str, dict[int, OperatorSubtaskState]]
) -> CompletedCheckpoint:
    md = CheckpointMetadata(
        job_id="j",
        checkpoint_id=n,
        trigger_time=1.0,
        completion_time=2.0,
        parallelism=2,
        max_parallelism=16,
        operators=operators,
        operator_parallelism={uid: 2 for uid in operators},
        stats=CheckpointStats(checkpoint_id=n, trigger_time=1.0, duration=1.0, state_size=0),
    )
    return CompletedCheckpoint(n, f"/ck/chk-{n}", md)


def _source_chain(graph: JobGraph) -> str:
    (chain_id,) = [c.chain_id for c in graph.chains if c.is_source]
    return chain_id


def test_a_discovering_sources_splits_wait_as_pending_and_go_to_whoever_asks() -> None:
    arrivals = ["a", "b", "c"]
    graph = _graph(GrowingSource(arrivals))
    enums = SourceEnumerators(graph, None)
    chain_id = _source_chain(graph)
    assert enums.initial_assignment() == {chain_id: [[], []]}, "nothing pushed at deployment"
    # Subtask 1 asks three times (it reads fast), subtask 0 once: no round-robin.
    assert enums.request(chain_id, 1) == [AddSplits(chain_id, 1, ["a"])]
    assert enums.request(chain_id, 1) == [AddSplits(chain_id, 1, ["b"])]
    assert enums.request(chain_id, 0) == [AddSplits(chain_id, 0, ["c"])]
    assert enums.request(chain_id, 1) == [], "nothing pending: the request is remembered"
    assert enums.request(chain_id, 1) == [], "a repeated request is still one request"
    assert enums.snapshot() == {chain_id: EnumeratorCheckpoint(["a", "b", "c"], ())}


def test_a_request_before_discovery_is_served_when_discovery_finds_splits() -> None:
    arrivals: list[str] = []
    graph = _graph(GrowingSource(arrivals))
    enums = SourceEnumerators(graph, None)
    chain_id = _source_chain(graph)
    enums.initial_assignment()
    assert enums.request(chain_id, 0) == []
    assert enums.request(chain_id, 1) == []
    arrivals += ["d", "e", "f"]
    assert enums.discover(0.5) == [], "not due yet"
    assert enums.next_discovery() == 1.0
    # Waiting subtasks in request order, one split each; the rest stays pending.
    assert enums.discover(1.0) == [AddSplits(chain_id, 0, ["d"]), AddSplits(chain_id, 1, ["e"])]
    assert enums.snapshot() == {chain_id: EnumeratorCheckpoint(["d", "e", "f"], ("f",))}
    assert enums.request(chain_id, 1) == [AddSplits(chain_id, 1, ["f"])]


def test_pending_splits_survive_a_restore_and_requests_do_not() -> None:
    arrivals = ["a", "b", "c"]
    graph = _graph(GrowingSource(arrivals))
    enums = SourceEnumerators(graph, None)
    chain_id = _source_chain(graph)
    enums.initial_assignment()
    enums.request(chain_id, 0)  # gets "a"; "b" and "c" stay pending
    stored = enums.snapshot()[chain_id]
    enums.request(chain_id, 1)  # "b", sent after the trigger: still pending in ``stored``
    restored = _checkpoint(
        4,
        {
            "src": {
                0: OperatorSubtaskState(
                    operator_lists={"splits": ["a@1"]}, union_lists={ENUMERATOR: [stored]}
                )
            }
        },
    )
    again = SourceEnumerators(graph, restored)
    assert again.initial_assignment() == {}, "restored readers keep their positions"
    assert again.discover(0.0) == [], "no request survives the restore"
    assert again.request(chain_id, 1) == [AddSplits(chain_id, 1, ["b"])]
    assert again.request(chain_id, 0) == [AddSplits(chain_id, 0, ["c"])]
    assert again.request(chain_id, 0) == []


def test_restore_gives_the_enumerator_its_checkpointed_state_and_no_initial_splits() -> None:
    """A checkpoint taken before splits were requested holds the bare enumerator state."""
    source = GrowingSource(["a", "b", "x"])
    graph = _graph(source)
    chain_id = _source_chain(graph)
    restored = _checkpoint(
        3,
        {
            "src": {
                0: OperatorSubtaskState(
                    operator_lists={"splits": ["a@5"]}, union_lists={ENUMERATOR: [["a", "b"]]}
                ),
                1: OperatorSubtaskState(operator_lists={"splits": ["b@2"]}),
            }
        },
    )
    assert restored_enumerator_state(restored, "src") == ["a", "b"]
    enums = SourceEnumerators(graph, restored)
    assert source.restored_with == [["a", "b"]]
    assert enums.initial_assignment() == {}, "restored readers keep their positions"
    # Only what the checkpoint did not know is new: no split is read twice.
    assert enums.discover(0.0) == []
    assert enums.request(chain_id, 1) == [AddSplits(chain_id, 1, ["x"])]


def test_a_static_sources_splits_are_assigned_round_robin_at_deployment() -> None:
    graph = _graph(es.sources.CollectionSource(range(10)), parallelism=2)
    enums = SourceEnumerators(graph, None)
    chain_id = _source_chain(graph)
    (first, second) = enums.initial_assignment()[chain_id]
    assert (len(first), len(second)) == (1, 1)
    assert enums.next_discovery() is None
    assert enums.request(chain_id, 0) == [], "everything was assigned: nothing ever comes"
    assert enums.snapshot() == {}
    with pytest.raises(ValueError, match="unknown source 'nope'"):
        enums.request("nope", 0)


class Partitions(Growing):
    """Splits read forever (Kafka-style partitions): pushed, not requested."""

    assign_on_demand = False


class PartitionSource(GrowingSource):
    def create_enumerator(self, parallelism: int, restored: Any) -> SplitEnumerator:
        return Partitions(self.arrivals, restored)


def test_splits_that_never_finish_are_pushed_round_robin_as_discovered() -> None:
    arrivals = ["a", "b", "c"]
    graph = _graph(PartitionSource(arrivals))
    enums = SourceEnumerators(graph, None)
    chain_id = _source_chain(graph)
    assert enums.initial_assignment() == {chain_id: [["a", "c"], ["b"]]}
    arrivals += ["d", "e"]
    assert enums.discover(1.0) == [AddSplits(chain_id, 0, ["e"]), AddSplits(chain_id, 1, ["d"])]
    assert enums.request(chain_id, 0) == [], "nothing waits to be requested"
    assert enums.snapshot() == {chain_id: ["a", "b", "c", "d", "e"]}


def test_a_bounded_source_that_discovers_splits_is_refused() -> None:
    source = GrowingSource([])
    source.bounded = True
    with pytest.raises(ConfigurationError, match=r"\(src\) is bounded but its enumerator Growing"):
        SourceEnumerators(_graph(source), None)


class Committables(Sink):
    def __init__(self, committed: list[tuple[int, list[Any]]], fail: bool = False) -> None:
        self.committed = committed
        self.fail = fail

    def create_writer(self, ctx: SinkContext) -> SinkWriter:
        raise NotImplementedError

    def create_committer(self, job_id: str) -> GlobalCommitter | None:
        sink = self

        class Recorder(GlobalCommitter):
            def last_committed(self) -> int:
                if sink.fail:
                    raise OSError("table locked")
                return max((c for c, _ in sink.committed), default=0)

            def commit(self, checkpoint_id: int, entries: list[Any]) -> None:
                if sink.fail:
                    raise OSError("table locked")
                sink.committed.append((checkpoint_id, sorted(entries)))

        return Recorder()


def test_global_commit_gets_every_writers_entries_of_the_checkpoint_at_once() -> None:
    committed: list[tuple[int, list[Any]]] = []
    graph = _graph(GrowingSource([]), sink=Committables(committed))
    commits = GlobalCommits(graph, "job")
    assert commits
    cp = _checkpoint(
        5,
        {
            "out": {
                0: OperatorSubtaskState(union_lists={TXNS: ["f0", "f2"]}),
                1: OperatorSubtaskState(union_lists={TXNS: ["f1"]}),
            }
        },
    )
    commits.commit(5, cp.metadata)
    assert committed == [(5, ["f0", "f1", "f2"])]


def test_global_commit_failure_names_sink_and_checkpoint() -> None:
    graph = _graph(GrowingSource([]), sink=Committables([], fail=True))
    with pytest.raises(
        SinkError, match=r"sink 'out' failed to commit checkpoint 2 \(0 entries\).*locked"
    ):
        GlobalCommits(graph, "job").commit(2, _checkpoint(2, {}).metadata)


def test_sinks_without_committer_have_no_global_commits() -> None:
    assert not GlobalCommits(_graph(GrowingSource([])), "job")


def test_the_sinks_last_commit_is_what_a_job_s_checkpoint_ids_start_above() -> None:
    """GlobalCommits.last_committed: the job master numbers checkpoints above it, so a
    fresh job on a table another job committed to is not taken for its replay."""
    committed: list[tuple[int, list[Any]]] = [(3, []), (7, [])]
    assert (
        GlobalCommits(
            _graph(GrowingSource([]), sink=Committables(committed)), "job"
        ).last_committed()
        == 7
    )
    assert (
        GlobalCommits(_graph(GrowingSource([]), sink=Committables([])), "job").last_committed() == 0
    )
    failing = GlobalCommits(_graph(GrowingSource([]), sink=Committables([], fail=True)), "job")
    with pytest.raises(
        SinkError, match="sink 'out' cannot read its last commit: OSError: table locked"
    ):
        failing.last_committed()
