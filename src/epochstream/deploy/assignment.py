"""What each task of an attempt gets: its restore state and its source splits.

Fresh start: split ``k`` of a source goes to subtask ``k % parallelism``. Restore:
every operator's state from the checkpoint is redistributed to the job's
parallelism (key groups for keyed state, round-robin for operator lists, the
whole union for union lists); source splits travel as operator list state, so a
source restores exactly the positions it checkpointed.

Example::

    splits = initial_splits(graph)
    per_slot = task_deployments(graph, coordinator.latest_completed, splits)
"""

from __future__ import annotations

import logging
import os
from typing import Any

from epochstream.checkpoint.coordinator import CompletedCheckpoint
from epochstream.checkpoint.storage import METADATA_FILE, load_metadata, scan_checkpoints
from epochstream.exceptions import ConfigurationError, StateError
from epochstream.graph.jobgraph import JobGraph
from epochstream.runtime.messages import TaskDeployment
from epochstream.state.handles import OperatorRestore
from epochstream.state.redistribute import build_restores

__all__ = ["initial_splits", "load_restore_point", "task_deployments"]

log = logging.getLogger(__name__)


def load_restore_point(
    path: str, graph: JobGraph, env: Any, allow_non_restored_state: bool
) -> CompletedCheckpoint:
    """The checkpoint a new job starts from, checked against the job graph.

    ``path`` is a ``chk-<n>`` directory, its ``_metadata`` file, or a directory holding
    completed checkpoints (the newest is taken). Adjusts ``graph.max_parallelism`` to the
    checkpoint's unless the user set one explicitly (then they must agree).
    """
    path = os.path.abspath(path)
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, METADATA_FILE)):
        entries = scan_checkpoints(path)
        readable = [e for e in entries if e.metadata is not None]
        for bad in (e for e in entries if e.metadata is None):
            log.warning("restore_from: skipping unreadable checkpoint %s: %s", bad.directory, bad.error)
        if not readable:
            detail = f" ({len(entries)} unreadable)" if entries else ""
            raise ConfigurationError(
                f"restore_from: no readable completed checkpoint under {path}{detail}"
            )
        newest = max(readable, key=lambda e: e.metadata.completion_time)  # type: ignore[union-attr]
        directory, md = newest.directory, newest.metadata
        assert md is not None
    else:
        directory, md = load_metadata(path)
    if md.max_parallelism != graph.max_parallelism:
        if getattr(env, "max_parallelism_explicit", True):
            raise StateError(
                f"restore_from {directory}: its max_parallelism is {md.max_parallelism} but the job "
                f"sets {graph.max_parallelism}; key groups are fixed for the life of the state"
            )
        if md.max_parallelism < graph.parallelism:
            raise StateError(
                f"restore_from {directory}: max_parallelism {md.max_parallelism} is below the "
                f"job's parallelism {graph.parallelism}"
            )
        graph.max_parallelism = md.max_parallelism
    unknown = sorted(
        uid
        for uid, states in md.operators.items()
        if uid not in set(graph.operator_uids) and any(not s.is_empty for s in states.values())
    )
    if unknown and not allow_non_restored_state:
        raise StateError(
            f"restore_from {directory}: state of operators {unknown} has no operator with that uid "
            "in this job; give operators stable uids with .uid(...), or pass "
            "allow_non_restored_state=True to drop it"
        )
    return CompletedCheckpoint(md.checkpoint_id, directory, md)


def initial_splits(graph: JobGraph) -> dict[str, list[list[Any]]]:
    """Per source chain, the splits of each subtask on a fresh start."""
    p = graph.parallelism
    out: dict[str, list[list[Any]]] = {}
    for chain in graph.chains:
        if not chain.is_source:
            continue
        per_subtask: list[list[Any]] = [[] for _ in range(p)]
        for k, split in enumerate(chain.head.payload.create_splits(p)):
            per_subtask[k % p].append(split)
        out[chain.chain_id] = per_subtask
    return out


def task_deployments(
    graph: JobGraph,
    restored: CompletedCheckpoint | None,
    splits: dict[str, list[list[Any]]],
) -> dict[int, list[TaskDeployment]]:
    """Per slot, the deployment of each of its tasks."""
    p = graph.parallelism
    restores: dict[str, list[OperatorRestore]] = {}
    if restored is not None:
        md = restored.metadata
        if md.max_parallelism != graph.max_parallelism:
            raise StateError(
                f"checkpoint {restored.directory} has max_parallelism {md.max_parallelism}, the job "
                f"{graph.max_parallelism}: key groups are fixed for the life of the state"
            )
        for uid in graph.operator_uids:
            states = md.operators.get(uid)
            if states is None:
                continue
            restores[uid] = build_restores(
                states,
                old_parallelism=md.operator_parallelism.get(uid, md.parallelism),
                new_parallelism=p,
                max_parallelism=graph.max_parallelism,
                checkpoint_dir=restored.directory,
            )
    slots: dict[int, list[TaskDeployment]] = {i: [] for i in range(p)}
    for chain in graph.chains:
        for i in range(p):
            restore = {
                uid: r[i]
                for uid, r in restores.items()
                if uid in {op.uid for op in chain.operators}
            }
            head_restored = chain.head.uid in restores
            slots[i].append(
                TaskDeployment(
                    chain_id=chain.chain_id,
                    subtask=i,
                    restore=restore,
                    splits=None
                    if (not chain.is_source or head_restored)
                    else splits[chain.chain_id][i],
                    restored_checkpoint=restored.checkpoint_id if restored else None,
                )
            )
    return slots
