"""Chaining rules, network edges and uids."""

from __future__ import annotations

import pytest

import epochstream as es


def _env() -> es.Environment:
    return es.Environment(parallelism=2, runner="local")


def test_forward_edges_chain_and_key_by_splits() -> None:
    env = _env()
    (
        env.from_collection(["a b", "c"])
        .flat_map(str.split)
        .map(lambda w: (w, 1))
        .key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]))
        .sink_to(es.sinks.DiscardSink())
    )
    jg = env.job_graph("wc")
    assert [[op.kind for op in c.operators] for c in jg.chains] == [
        ["source", "flat_map", "map"],
        ["reduce", "sink"],
    ]
    (edge,) = jg.edges
    assert edge.partitioning.kind == "hash"
    assert jg.chains[1].inputs == [edge]
    assert jg.max_parallelism == 128


def test_branching_forward_outputs_stay_in_one_chain() -> None:
    env = _env()
    src = env.from_sequence(0, 10)
    src.filter(lambda i: i % 2 == 0).sink_to(es.sinks.DiscardSink())
    src.filter(lambda i: i % 2 == 1).sink_to(es.sinks.DiscardSink())
    jg = env.job_graph()
    assert len(jg.chains) == 1 and len(jg.chains[0].operators) == 5
    assert len(jg.chains[0].head.outputs) == 2


def test_rebalance_and_broadcast_make_edges() -> None:
    env = _env()
    env.from_sequence(0, 10).rebalance().map(str).broadcast().map(len).print()
    jg = env.job_graph()
    assert [e.partitioning.kind for e in jg.edges] == ["rebalance", "broadcast"]


def test_uids_are_kept_and_must_be_unique() -> None:
    env = _env()
    env.from_sequence(0, 10).uid("numbers").map(str).uid("fmt").print()
    assert env.job_graph().operator_uids[:2] == ["numbers", "fmt"]
    env2 = _env()
    env2.from_sequence(0, 10).uid("x").map(str).uid("x").print()
    with pytest.raises(es.ConfigurationError, match="used twice"):
        env2.job_graph()


def test_jobs_without_sink_or_with_keyed_op_on_unkeyed_stream_are_rejected() -> None:
    env = _env()
    env.from_sequence(0, 10).map(str)
    with pytest.raises(es.ConfigurationError, match="no sink"):
        env.job_graph()
    with pytest.raises(es.ConfigurationError):
        env.from_sequence(0, 3).map(42)  # type: ignore[arg-type]
