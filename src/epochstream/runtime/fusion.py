"""Fusing consecutive map, filter and flat_map operators of a chain into one loop.

Unfused, each operator of ``map(f).filter(p).map(g)`` loops over its input batch and
builds a new list for the next one. Fused, the first operator's ``process_batch`` runs
one loop that takes each record through every step (``x = f(x)``, ``if not p(x):
continue``, ``x = g(x)``; a flat_map step is a nested loop) and hands the result to the
last operator's output. The operators themselves stay as they are (their ``open``,
``close``, snapshots and watermark path are unchanged); only the record path skips
the intermediate lists.

A run holds at most one step that changes the number of records (filter, flat_map), so
each operator's ``records_in`` / ``records_out`` still follows from the batch's input
and output lengths: the counts stay per batch. Keyed operators (rich functions after
``key_by``, which set the current key per record) and operators with more than one
consumer end a run. A failing step is reported as that operator's error with the value
it was given, as unfused.

Example::

    fuse_runs(chain, ops, counters)    # before wire_chain connects the outputs
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from epochstream.exceptions import UserFunctionError
from epochstream.graph.jobgraph import ChainSpec, OperatorSpec
from epochstream.runtime.metrics import OperatorCounters
from epochstream.runtime.operators import FilterOperator, FlatMapOperator, MapOperator, Operator

__all__ = ["fusable_runs", "fuse_runs"]

_STEPS: dict[type[Operator], str] = {
    MapOperator: "map",
    FilterOperator: "filter",
    FlatMapOperator: "flat_map",
}
_CHANGES_COUNT = ("filter", "flat_map")

#: A generated loop: (records, timestamps or None, step functions) ->
#: (out, out timestamps or None, failing step or -1, its input, its error or None).
_Loop = Callable[[list[Any], "list[Any] | None", list[Any]], tuple[Any, Any, int, Any, Any]]
_LOOPS: dict[tuple[tuple[str, ...], bool], _Loop] = {}


def fusable_runs(chain: ChainSpec, ops: dict[str, Operator]) -> list[list[OperatorSpec]]:
    """The runs of two or more consecutive operators of ``chain`` that fuse."""
    runs: list[list[OperatorSpec]] = []
    run: list[OperatorSpec] = []
    for spec in chain.operators:
        op = ops[spec.uid]
        fusable = type(op) in _STEPS and op.keyed is None
        joins = (
            fusable
            and bool(run)
            and _feeds_only(run[-1], spec)
            and not (spec.kind in _CHANGES_COUNT and any(s.kind in _CHANGES_COUNT for s in run))
        )
        if joins:
            run.append(spec)
            continue
        if len(run) >= 2:
            runs.append(run)
        run = [spec] if fusable else []
    if len(run) >= 2:
        runs.append(run)
    return runs


def _feeds_only(upstream: OperatorSpec, downstream: OperatorSpec) -> bool:
    """True if ``downstream`` is ``upstream``'s one and only (main, chained) output."""
    return [(o.tag, o.chained_uid) for o in upstream.outputs] == [("main", downstream.uid)]


def fuse_runs(
    chain: ChainSpec, ops: dict[str, Operator], counters: dict[str, OperatorCounters]
) -> None:
    """Give the first operator of each fusable run the run's fused ``process_batch``.

    Call before the chain's outputs are wired: an upstream output binds its consumer's
    ``process_batch`` when it is wired.
    """
    for run in fusable_runs(chain, ops):
        first = ops[run[0].uid]
        first.process_batch = _fused(  # type: ignore[method-assign,assignment]
            [ops[s.uid] for s in run], [counters[s.uid] for s in run]
        )


def _fused(
    run: list[Operator], counters: list[OperatorCounters]
) -> Callable[[list[Any], list[Any] | None], None]:
    kinds = tuple(_STEPS[type(op)] for op in run)
    plain, timed = _loop(kinds, timed=False), _loop(kinds, timed=True)
    changes = next((i for i, k in enumerate(kinds) if k in _CHANGES_COUNT), len(kinds))
    last = run[-1]

    def process_batch(records: list[Any], timestamps: list[Any] | None) -> None:
        # Operators are opened after wiring: their step functions are read per batch.
        fns = [op._fn for op in run]  # type: ignore[attr-defined]
        loop = plain if timestamps is None else timed
        out, out_ts, step, value, exc = loop(records, timestamps, fns)
        if exc is not None:
            raise UserFunctionError(run[step].ctx.task_name, value, exc) from exc
        n_in, n_out = len(records), len(out)
        for i in range(len(run) - 1):  # the last operator's output counts itself
            n = n_in if i < changes else n_out
            counters[i].records_out += n
            counters[i + 1].records_in += n
        if out or changes == len(kinds):
            last.output.collect(out, timestamps if changes == len(kinds) else out_ts)

    return process_batch


def _loop(kinds: tuple[str, ...], *, timed: bool) -> _Loop:
    """The loop of a run of ``kinds``, generated once per shape (a nested function per
    step would cost a call per record and step)."""
    key = (kinds, timed)
    loop = _LOOPS.get(key)
    if loop is None:
        namespace: dict[str, Any] = {}
        source, steps = _loop_source(kinds, timed)
        exec(source, namespace)  # the source is built from fixed kinds
        namespace["STEPS"].update(steps)
        loop = _LOOPS[key] = namespace["fused"]
    return loop


def _loop_source(kinds: tuple[str, ...], timed: bool) -> tuple[str, dict[int, int]]:
    """The loop's source, and which step each of its lines runs.

    Which step failed is read from the traceback's line number, so the loop does not
    track it per record. Timestamps are collected only when a step changes the record
    count; a run of maps keeps the input's list.
    """
    collect_ts = timed and any(k in _CHANGES_COUNT for k in kinds)
    names = ", ".join(f"f{i}" for i in range(len(kinds)))
    lines = [
        "STEPS = {}",
        "def fused(records, timestamps, fns):",
        f"    {names}, = fns",
        "    out = []",
        "    append = out.append",
        "    out_ts = [] if timestamps is not None else None",
        "    x = None",
        "    try:",
    ]
    if collect_ts:
        lines.append("        keep_ts = out_ts.append")
        lines.append("        for x, ts in zip(records, timestamps, strict=True):")
    else:
        lines.append("        for x in records:")
    steps: dict[int, int] = {}
    pad = " " * 12
    last = len(kinds) - 1
    for i, kind in enumerate(kinds):
        steps[len(lines) + 1] = i  # line numbers count from 1
        if kind == "map" and i == last:
            lines.append(f"{pad}append(f{i}(x))")
        elif kind == "map":
            lines.append(f"{pad}x = f{i}(x)")
        elif kind == "filter":
            lines.append(f"{pad}if not f{i}(x):")
            lines.append(f"{pad}    continue")
        else:  # flat_map: the steps after it run per element
            lines.append(f"{pad}for x in f{i}(x):")
            pad += "    "
    if kinds[last] != "map":
        lines.append(f"{pad}append(x)")
    if collect_ts:
        lines.append(f"{pad}keep_ts(ts)")
    lines += [
        "    except Exception as exc:",
        "        return out, out_ts, STEPS.get(exc.__traceback__.tb_lineno, 0), x, exc",
        "    return out, out_ts, -1, None, None",
    ]
    return "\n".join(lines) + "\n", steps
