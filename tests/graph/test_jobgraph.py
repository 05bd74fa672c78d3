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


# ---------------------------------------------------------------- automatic uids

import logging  # noqa: E402


def _counts(env: es.Environment, extra_branch: bool, extra_upstream: bool = False) -> list[str]:
    src = env.from_sequence(0, 10)
    if extra_branch:
        src.map(lambda i: -i).print()  # an unrelated operator on another branch
    head = src.map(lambda i: i + 1) if extra_upstream else src
    head.key_by(lambda i: i % 2).sum().print()
    graph = env.job_graph()
    return [op.uid for c in graph.chains for op in c.operators if op.kind in ("source", "reduce")]


def test_automatic_uids_are_stable_under_unrelated_changes() -> None:
    plain = _counts(es.Environment(parallelism=1), extra_branch=False)
    again = _counts(es.Environment(parallelism=1), extra_branch=False)
    branched = _counts(es.Environment(parallelism=1), extra_branch=True)
    assert plain == again == branched
    assert all(uid.startswith(("source-", "reduce-")) for uid in plain)
    upstream = _counts(es.Environment(parallelism=1), extra_branch=False, extra_upstream=True)
    assert upstream[0] == plain[0] and upstream[1] != plain[1]  # why explicit uids matter


def test_identical_siblings_get_distinct_uids() -> None:
    env = es.Environment(parallelism=1)
    src = env.from_sequence(0, 10)
    src.map(str).print()
    src.map(str).print()
    uids = env.job_graph().operator_uids
    assert len(uids) == len(set(uids))


def test_stateful_operators_without_uid_are_warned(tmp_path, caplog) -> None:
    env = es.Environment(parallelism=1, runner="local")
    env.enable_checkpointing(1.0, storage=str(tmp_path))
    env.from_sequence(0, 10).uid("numbers").key_by(lambda i: i % 2).sum().print()
    with caplog.at_level(logging.WARNING):
        env.execute("warned")
    assert "stateful operators without an explicit uid: reduce" in caplog.text
    assert "numbers" not in caplog.text.split("explicit uid:")[1].split(".")[0]
