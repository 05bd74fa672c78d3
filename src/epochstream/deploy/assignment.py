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
from typing import Any

from epochstream.checkpoint.metadata import CheckpointMetadata
from epochstream.checkpoint.pending import CompletedCheckpoint
from epochstream.checkpoint.storage import METADATA_FILE, load_metadata, scan_checkpoints
from epochstream.core.filesystems import (
    check_trusted_location,
    normalize_location,
    storage_fs,
)
from epochstream.core.state_schema import class_changes
from epochstream.deploy.enumeration import SourceEnumerators
from epochstream.exceptions import ConfigurationError, StateError
from epochstream.graph.jobgraph import JobGraph
from epochstream.graph.launch import JobDescription
from epochstream.runtime.messages import TaskDeployment
from epochstream.state.channel_state import OUTPUT, ChannelRestore
from epochstream.state.handles import OperatorRestore, OperatorSubtaskState, saved_schemas
from epochstream.state.redistribute import build_restores

__all__ = [
    "check_restore_point",
    "initial_splits",
    "load_restore_point",
    "operator_class_changes",
    "restore_candidates",
    "task_deployments",
]

log = logging.getLogger(__name__)


def restore_candidates(
    path: str, options: Any = None, *, trust_shared: bool = False
) -> list[CompletedCheckpoint]:
    """The readable completed checkpoints (or the savepoint) at ``path``, newest first.

    ``path`` is a ``chk-<n>`` or savepoint directory, its ``_metadata`` file, or a
    directory holding completed checkpoints (a job directory or a storage root).
    Unreadable ones are skipped with a warning; none readable is a
    :class:`ConfigurationError`. A local ``path`` other local users could change raises
    :class:`~epochstream.exceptions.UntrustedStorageError` unless ``trust_shared``.
    """
    location = normalize_location(path)
    check_trusted_location(location, what="restore path", trust_shared=trust_shared)
    fs = storage_fs(location, options)
    single = location.endswith("/" + METADATA_FILE) or fs.exists(fs.join(location, METADATA_FILE))
    if single:
        directory, md = load_metadata(location, options, trust_shared=trust_shared)
        return [CompletedCheckpoint(md.checkpoint_id, directory, md, owned=False)]
    entries = scan_checkpoints(location, options, trust_shared=trust_shared)
    for bad in (e for e in entries if e.metadata is None):
        log.warning("restore: skipping unreadable checkpoint %s: %s", bad.directory, bad.error)
    readable = [e for e in entries if e.metadata is not None]
    if not readable:
        detail = f" ({len(entries)} unreadable)" if entries else ""
        raise ConfigurationError(
            f"restore: no readable completed checkpoint under {location}{detail}"
        )
    readable.sort(key=lambda e: e.metadata.completion_time, reverse=True)  # type: ignore[union-attr]
    return [
        CompletedCheckpoint(e.checkpoint_id, e.directory, e.metadata, owned=False)  # type: ignore[arg-type]
        for e in readable
    ]


def check_restore_point(point: CompletedCheckpoint, description: JobDescription) -> None:
    """Check ``point`` against the described job's graph; adopt its max parallelism when
    the job did not set one (key groups are fixed for the life of the state)."""
    directory, md, graph = point.directory, point.metadata, description.graph
    if md.max_parallelism != graph.max_parallelism:
        if description.max_parallelism_explicit:
            raise StateError(
                f"restore from {directory}: its max_parallelism is {md.max_parallelism} but the "
                f"job sets {graph.max_parallelism}; key groups are fixed for the life of the state"
            )
        graph.max_parallelism = md.max_parallelism
    if graph.parallelism > graph.max_parallelism:
        raise StateError(
            f"restore from {directory}: parallelism {graph.parallelism} is above the state's "
            f"max_parallelism {graph.max_parallelism}; a job cannot have more subtasks than key "
            "groups (choose a parallelism <= max_parallelism)"
        )
    unknown = sorted(
        uid
        for uid, states in md.operators.items()
        if uid not in set(graph.operator_uids) and any(not s.is_empty for s in states.values())
    )
    if unknown and not description.allow_non_restored_state:
        raise StateError(
            f"restore from {directory}: state of operators {unknown} has no operator with that "
            "uid in this job; give operators stable uids with .uid(...), or pass "
            "allow_non_restored_state=True to drop it"
        )


def load_restore_point(path: str, description: JobDescription) -> list[CompletedCheckpoint]:
    """The restore point at ``path`` (newest first, older ones as fallbacks), checked
    against the described job (read with its checkpoint storage's options)."""
    config = description.checkpoint_config
    options = config.storage_options if config is not None else None
    candidates = restore_candidates(path, options, trust_shared=description.trust_shared_storage)
    check_restore_point(candidates[0], description)
    return candidates


def operator_class_changes(states: dict[int, OperatorSubtaskState]) -> dict[str, list[str]]:
    """Per keyed state of one operator in a snapshot, how the classes of its saved values
    differ from the classes of those names in this process (the job master's, where the
    job's script is loaded), as :func:`~epochstream.core.state_schema.class_changes`
    words it; states without a change are left out.

    Example: ``operator_class_changes(md.operators["profiles"])``
    """
    handles = [s.keyed for s in states.values() if s.keyed is not None]
    found = {name: class_changes(schema) for name, schema in saved_schemas(handles).items()}
    return {name: changes for name, changes in found.items() if changes}


def initial_splits(graph: JobGraph) -> dict[str, list[list[Any]]]:
    """Per source chain, the splits of each subtask on a fresh start."""
    return SourceEnumerators(graph, None).initial_assignment()


def channel_state_restores(
    graph: JobGraph, md: CheckpointMetadata, directory: str
) -> dict[tuple[str, int], list[ChannelRestore]]:
    """Per (chain, new subtask), the channel state of an unaligned checkpoint it replays.

    Output frames go back to the upstream subtask that kept them (``old % new``
    parallelism when it changed, then re-partitioned); input frames to the same subtask,
    or, when the parallelism changed, on a hash edge to every new subtask (each keeps
    its key groups) and otherwise round robin (``old % new``). A broadcast edge's channel
    state cannot be split at another parallelism, and channel state of an edge the job
    no longer has would be lost: both raise :class:`StateError`.

    Example: ``channel_state_restores(graph, restored.metadata, restored.directory)``
    """
    p = graph.parallelism
    edges = {graph.edge_key(edge): edge for edge in graph.edges}
    out: dict[tuple[str, int], list[ChannelRestore]] = {}
    for uid, subtasks in md.operators.items():
        old_p = md.operator_parallelism.get(uid, md.parallelism)
        for old, state in sorted(subtasks.items()):
            handle = state.channel
            if handle is None:
                continue
            for entry in handle.entries:
                edge = edges.get(entry.edge)
                if edge is None:
                    raise StateError(
                        f"checkpoint {directory} holds records in flight on edge {entry.edge}, "
                        "which this job does not have: restore the job it was taken of, or "
                        "take a savepoint (savepoints are aligned: nothing in flight)"
                    )
                same = old_p == p
                kind = edge.partitioning.kind
                if kind == "broadcast" and not same:
                    raise StateError(
                        f"checkpoint {directory} holds records in flight on broadcast edge "
                        f"{entry.edge}; they cannot be split from parallelism {old_p} to {p}: "
                        "restore at the same parallelism, or rescale through a savepoint "
                        "(savepoints are aligned)"
                    )
                if entry.direction == OUTPUT:
                    chain, targets, reroute = edge.source_chain, [old % p], not same
                elif same:
                    chain, targets, reroute = edge.target_chain, [old], False
                elif kind == "hash":
                    chain, targets, reroute = edge.target_chain, list(range(p)), True
                else:
                    chain, targets, reroute = edge.target_chain, [old % p], False
                for target in targets:
                    out.setdefault((chain, target), []).append(
                        ChannelRestore(handle, entry, reroute)
                    )
    return out


def task_deployments(
    graph: JobGraph,
    restored: CompletedCheckpoint | None,
    splits: dict[str, list[list[Any]]],
) -> dict[int, list[TaskDeployment]]:
    """Per slot, the deployment of each of its tasks."""
    p = graph.parallelism
    restores: dict[str, list[OperatorRestore]] = {}
    channels: dict[tuple[str, int], list[ChannelRestore]] = {}
    if restored is not None:
        channels = channel_state_restores(graph, restored.metadata, restored.directory)
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
                owned=restored.owned,
            )
            changes = operator_class_changes(states)
            for subtask_restore in restores[uid]:
                subtask_restore.class_changes = changes
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
                    channel_state=channels.get((chain.chain_id, i), []),
                )
            )
    return slots
