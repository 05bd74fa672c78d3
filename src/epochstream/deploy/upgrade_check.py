"""``epochstream check-upgrade``: would this job start from that savepoint? A dry run.

:func:`check_upgrade` takes the new job's :class:`~epochstream.graph.launch.JobDescription`
(built by running its script up to ``execute()``, which does not start it) and a savepoint
or retained checkpoint, and tells what the restore would do, through the same code the
restore runs, never a second copy of its rules:

- job level: :func:`~epochstream.deploy.assignment.check_restore_point` (max parallelism
  adopted or refused, parallelism above it, state of operators the job lacks);
- per keyed operator: the operator is built as a task builds it, restored into a
  :class:`~epochstream.deploy.dry_run_backend.DryRunKeyedBackend` (no data loaded) and
  ``open()``-ed, so each state its ``open()`` asks for gets the evolution rule's verdict
  (restore / migrate / fail, with the restore's own error); the classes of the saved
  values are compared as the job master compares them
  (:func:`~epochstream.deploy.assignment.operator_class_changes`), in this process where
  the job's script is loaded;
- from the savepoint's own files: whether each state's serializer changed (its values
  are then read with the saved one and rewritten with the new one) and whether its TTL
  was switched on or off (canonical savepoint files record both; for a retained
  checkpoint they are reported unknown);
- sources whose split positions the job takes over, sinks whose pending transactions
  the restore commits.

What it cannot see: ``open()`` runs in the checking process (a function that connects
somewhere in ``open()`` does so here too); a state first asked for after ``open()`` is
reported *undeclared* (checked when first used); columnar SQL state (row and column
tables) is reported *unchecked*. A non-keyed operator is not opened (its operator list
state has no schema to check).

Example::

    report = check_upgrade(description, "/sp/savepoint-3f2a9c-1b2c")
    report.ok, [op.status for op in report.operators]
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow.compute as pc

from epochstream.checkpoint.pending import CompletedCheckpoint
from epochstream.core.clock import SystemClock
from epochstream.core.filesystems import storage_fs
from epochstream.core.serializers import Serializer
from epochstream.core.state_schema import StateSchema
from epochstream.deploy.assignment import (
    channel_state_restores,
    check_restore_point,
    operator_class_changes,
    restore_candidates,
)
from epochstream.deploy.dry_run_backend import DryRunKeyedBackend, StateOutcome, is_descriptor_kind
from epochstream.exceptions import StateError
from epochstream.graph.jobgraph import OperatorSpec
from epochstream.graph.launch import JobDescription
from epochstream.runtime.operators import OperatorContext, create_operator
from epochstream.runtime.operators.connectors import SPLITS, TXNS
from epochstream.state.backends.base import KeyedBackendContext
from epochstream.state.canonical import read_batches, read_state_meta
from epochstream.state.handles import (
    CanonicalSnapshotHandle,
    ColumnarSnapshotHandle,
    KeyedStateHandle,
    OperatorRestore,
    OperatorSubtaskState,
    saved_schemas,
)
from epochstream.state.keygroups import key_group_range_for_operator
from epochstream.state.operator import OperatorStateStore

__all__ = [
    "STATE_VERDICTS",
    "OperatorCheck",
    "StateCheck",
    "UpgradeReport",
    "check_upgrade",
    "load_savepoint",
]

#: A state's verdict: the evolution rule's three, ``new`` (nothing saved under its
#: name), ``undeclared`` (saved, not asked for in ``open()``), ``unchecked`` (columnar
#: SQL state) and ``dropped`` (no keyed operator of the job has its uid).
STATE_VERDICTS = ("restore", "migrate", "fail", "new", "undeclared", "unchecked", "dropped")


@dataclass(frozen=True)
class StateCheck:
    """One state of one operator: what was saved, what the job declares, the verdict.

    ``serializer_changed``, ``saved_ttl`` (its entries carry TTL timestamps) and
    ``ttl`` (the descriptor has a TTL) are ``None`` when unknown (a retained
    checkpoint's files, a state the job did not declare).

    Example: ``StateCheck("profile", "migrate", "value", 1, "value", 2)``
    """

    name: str
    verdict: str
    saved_kind: str | None = None
    saved_version: int | None = None
    kind: str | None = None
    version: int | None = None
    error: str = ""
    serializer_changed: bool | None = None
    #: The descriptor has ``migrate=`` (``None``: no descriptor asked for the state).
    migrate_given: bool | None = None
    saved_ttl: bool | None = None
    ttl: bool | None = None

    @property
    def migration_needed(self) -> bool | None:
        """Whether the descriptor's version is above the saved one (``None``: unknown)."""
        if self.saved_version is None or self.version is None:
            return None
        return self.version > self.saved_version

    @property
    def ttl_changed(self) -> bool | None:
        """Whether a TTL was switched on or off (``None``: unknown)."""
        if self.saved_ttl is None or self.ttl is None:
            return None
        return self.saved_ttl != self.ttl

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict,
            "saved_kind": self.saved_kind,
            "saved_version": self.saved_version,
            "kind": self.kind,
            "version": self.version,
            "error": self.error or None,
            "serializer_changed": self.serializer_changed,
            "migration_needed": self.migration_needed,
            "migrate_given": self.migrate_given,
            "saved_ttl": self.saved_ttl,
            "ttl": self.ttl,
            "ttl_changed": self.ttl_changed,
        }


@dataclass
class OperatorCheck:
    """One operator uid: ``restored`` (state saved and the job has it), ``new`` (starts
    empty) or ``left_behind`` (state saved, no such uid in the job); its states;
    ``error``: its ``open()`` failed otherwise than by a state's verdict;
    ``renamed_from``/``renamed_to``: a left-behind uid whose states (names and kinds,
    internal ``_...`` ones aside) are exactly a new operator's, likely the same operator
    under another uid.

    Example: ``OperatorCheck("profiles", "count visits", "restored")``
    """

    uid: str
    name: str
    status: str
    states: list[StateCheck] = field(default_factory=list)
    error: str = ""
    renamed_from: str | None = None
    renamed_to: str | None = None

    @property
    def fails(self) -> bool:
        return bool(self.error) or any(s.verdict == "fail" for s in self.states)

    def to_json(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "name": self.name,
            "status": self.status,
            "error": self.error or None,
            "renamed_from": self.renamed_from,
            "renamed_to": self.renamed_to,
            "states": [s.to_json() for s in self.states],
        }


@dataclass
class UpgradeReport:
    """The outcome of :func:`check_upgrade`; ``ok``: the restore would succeed.

    Example: ``json.dumps(report.to_json())``
    """

    savepoint: str
    checkpoint_id: int
    snapshot_kind: str
    saved_job_name: str
    saved_max_parallelism: int
    job_max_parallelism: int | None
    max_parallelism: int
    parallelism: int
    allow_non_restored_state: bool
    #: Job-level refusals (the restore's own error messages).
    errors: list[str] = field(default_factory=list)
    operators: list[OperatorCheck] = field(default_factory=list)
    #: Per source uid, the number of split positions the job takes over.
    sources: dict[str, int] = field(default_factory=dict)
    #: Per sink uid, the number of pending transactions the restore commits.
    sinks: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors and not any(op.fails for op in self.operators)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "savepoint": {
                "path": self.savepoint,
                "checkpoint_id": self.checkpoint_id,
                "kind": self.snapshot_kind,
                "job_name": self.saved_job_name,
            },
            "max_parallelism": {
                "savepoint": self.saved_max_parallelism,
                "job": self.job_max_parallelism,
                "used": self.max_parallelism,
            },
            "parallelism": self.parallelism,
            "allow_non_restored_state": self.allow_non_restored_state,
            "errors": list(self.errors),
            "operators": [op.to_json() for op in self.operators],
            "sources": [{"uid": u, "splits": n} for u, n in sorted(self.sources.items())],
            "sinks": [{"uid": u, "pending_transactions": n} for u, n in sorted(self.sinks.items())],
        }


def load_savepoint(path: str, description: JobDescription) -> CompletedCheckpoint:
    """The newest readable snapshot at ``path``, read with the job's storage options;
    ``ConfigurationError`` (or an untrusted-storage refusal) when there is none."""
    config = description.checkpoint_config
    options = config.storage_options if config is not None else None
    return restore_candidates(path, options, trust_shared=description.trust_shared_storage)[0]


def check_upgrade(description: JobDescription, point: CompletedCheckpoint) -> UpgradeReport:
    """What starting the described job from ``point`` would do (see the module docstring).

    Call it where the job's script is loaded (its classes are compared with the saved
    values'). It adopts the savepoint's max parallelism into ``description.graph`` when
    the job sets none, as the restore does.

    Example: ``check_upgrade(description, load_savepoint("/sp/savepoint-1", description)).ok``
    """
    graph, md = description.graph, point.metadata
    report = UpgradeReport(
        savepoint=point.directory,
        checkpoint_id=point.checkpoint_id,
        snapshot_kind=md.kind,
        saved_job_name=md.job_name,
        saved_max_parallelism=md.max_parallelism,
        job_max_parallelism=graph.max_parallelism if description.max_parallelism_explicit else None,
        max_parallelism=graph.max_parallelism,
        parallelism=graph.parallelism,
        allow_non_restored_state=description.allow_non_restored_state,
    )
    try:
        check_restore_point(point, description)
    except StateError as err:
        report.errors.append(str(err))
    try:  # an unaligned checkpoint's in-flight records need the same edges
        channel_state_restores(graph, md, point.directory)
    except StateError as err:
        report.errors.append(str(err))
    report.max_parallelism = graph.max_parallelism
    saved = {uid: states for uid, states in md.operators.items() if _holds_state(states)}
    _check_operators(report, description, point, saved)
    for uid in sorted(set(saved) - set(graph.operator_uids)):
        report.operators.append(
            OperatorCheck(uid, "", "left_behind", states=_dropped_states(saved[uid]))
        )
    _hint_renames(report.operators)
    return report


def _check_operators(
    report: UpgradeReport,
    description: JobDescription,
    point: CompletedCheckpoint,
    saved: dict[str, dict[int, OperatorSubtaskState]],
) -> None:
    """Each operator of the job: its status and states; sources' positions and sinks'
    pending transactions."""
    config = description.checkpoint_config
    options = config.storage_options if config is not None else None
    for spec in (op for chain in description.graph.chains for op in chain.operators):
        states = saved.get(spec.uid)
        check = OperatorCheck(spec.uid, spec.name, "new" if states is None else "restored")
        if spec.key_selector is not None:
            _check_keyed(check, spec, description, point, states or {}, options)
        elif states is not None:
            check.states = _dropped_states(states)  # the operator is no longer keyed
        report.operators.append(check)
        if states is not None and spec.kind == "source":
            report.sources[spec.uid] = _entries(states, SPLITS, union=False)
        if states is not None and spec.kind == "sink":
            report.sinks[spec.uid] = _entries(states, TXNS, union=True)


def _holds_state(states: dict[int, OperatorSubtaskState]) -> bool:
    return any(not s.is_empty for s in states.values())


def _entries(states: dict[int, OperatorSubtaskState], name: str, *, union: bool) -> int:
    """How many entries of operator list (or union list) state ``name`` the snapshot
    holds over all subtasks (a restore hands union entries to every subtask, and the
    job master commits a sink's entries once per checkpoint)."""
    lists = (s.union_lists if union else s.operator_lists for s in states.values())
    return sum(len(entries.get(name, [])) for entries in lists)


# ---------------------------------------------------------------- the saved side


@dataclass(frozen=True)
class _SavedState:
    kind: str
    schema: StateSchema
    serializer: Serializer | None  # None: not recorded where the check can read it
    has_ttl: bool | None


def _saved_states(
    states: dict[int, OperatorSubtaskState], options: dict[str, Any] | None
) -> dict[str, _SavedState]:
    """Each keyed state of one operator's snapshot: kind and schema from the handles,
    serializer and TTL from canonical (savepoint) files, ``None`` elsewhere."""
    handles = _handles(states)
    kinds = _kinds(handles)
    schemas = saved_schemas(handles)
    canonical = [
        h
        for h in handles
        if isinstance(h, CanonicalSnapshotHandle) and not isinstance(h, ColumnarSnapshotHandle)
    ]
    serializers: dict[str, Serializer] = {}
    with_ttl: set[str] = set()
    for handle in canonical:
        fs = storage_fs(handle.path, options)
        serializers.update({n: m.serializer for n, m in read_state_meta(fs, handle.path).items()})
        with_ttl |= _states_with_ttl(fs, handle)
    known = bool(canonical) and len(canonical) == len(handles)
    return {
        name: _SavedState(
            kind,
            schemas.get(name, StateSchema()),
            serializers.get(name) if known else None,
            (name in with_ttl) if known else None,
        )
        for name, kind in kinds.items()
    }


def _handles(states: dict[int, OperatorSubtaskState]) -> list[KeyedStateHandle]:
    return [s.keyed for s in states.values() if s.keyed is not None]


def _kinds(handles: list[KeyedStateHandle]) -> dict[str, str]:
    """The kind of each state the handles hold (all handles of one operator)."""
    kinds: dict[str, str] = {}
    for handle in handles:
        kinds.update(getattr(handle, "states", {}))
    return kinds


def _states_with_ttl(fs: Any, handle: CanonicalSnapshotHandle) -> set[str]:
    """The states of a canonical file with TTL timestamps (entries written under a TTL)."""
    found: set[str] = set()
    for _kg, batch in read_batches(fs, handle, sorted(handle.batches)):
        stamped = batch.filter(pc.is_valid(batch.column("ttl_ts")))
        found.update(pc.unique(stamped.column("state")).to_pylist())
    return found


def _dropped_states(states: dict[int, OperatorSubtaskState]) -> list[StateCheck]:
    """The saved keyed states of an uid the job has no keyed operator for: a restore
    does not read them (a left-behind uid's are refused unless allowed)."""
    handles = _handles(states)
    kinds = _kinds(handles)
    schemas = saved_schemas(handles)
    return [
        StateCheck(
            name,
            "dropped",
            saved_kind=kind,
            saved_version=schemas[name].version if is_descriptor_kind(kind) else None,
        )
        for name, kind in sorted(kinds.items())
    ]


# ---------------------------------------------------------------- the new side


def _check_keyed(
    check: OperatorCheck,
    spec: OperatorSpec,
    description: JobDescription,
    point: CompletedCheckpoint,
    states: dict[int, OperatorSubtaskState],
    options: dict[str, Any] | None,
) -> None:
    """Build, restore and open one keyed operator against a dry-run backend (subtask 0
    declares what every subtask does), then compare what it asked for with the saved
    states."""
    graph = description.graph
    restore = _restore_of(states) if states else None
    backend = DryRunKeyedBackend(
        KeyedBackendContext(
            operator_uid=spec.uid,
            subtask=0,
            max_parallelism=graph.max_parallelism,
            key_group_range=key_group_range_for_operator(
                graph.max_parallelism, min(graph.parallelism, graph.max_parallelism), 0
            ),
            clock=SystemClock(),
            local_dir="",
        ),
        state_backend_name=str(getattr(description.state_backend, "NAME", "heap")),
    )
    ctx = OperatorContext(
        subtask_index=0,
        parallelism=graph.parallelism,
        max_parallelism=graph.max_parallelism,
        attempt=1,
        job_id="check-upgrade",
        task_name=f"{spec.name} (1/{graph.parallelism})",
        operator_state=OperatorStateStore(),
        keyed_backend=backend,
        checkpointing=description.checkpoint_config is not None,
        clock=SystemClock(),
        watermark_interval_ms=graph.auto_watermark_interval,
    )
    try:
        operator = create_operator(spec, ctx)
        operator.initialize_state(restore, point.checkpoint_id if restore else None)
        operator.open()
        operator.close()
    except Exception as err:  # reported: the real restore fails the same way
        check.error = f"{type(err).__name__}: {err}"
    saved = _saved_states(states, options) if states else {}
    check.states = [_state_check(o, saved.get(o.name)) for o in backend.outcomes.values()]
    asked = set(backend.outcomes)
    for name, item in sorted(saved.items()):
        if name in asked:
            continue
        if not is_descriptor_kind(item.kind):
            check.states.append(StateCheck(name, "unchecked", saved_kind=item.kind))
        else:
            check.states.append(
                StateCheck(
                    name,
                    "undeclared",
                    saved_kind=item.kind,
                    saved_version=item.schema.version,
                )
            )


def _restore_of(states: dict[int, OperatorSubtaskState]) -> OperatorRestore:
    """Everything the snapshot holds of one operator, as one subtask's restore (the dry
    run reads no data, so it takes every file's list of states)."""
    restore = OperatorRestore(class_changes=operator_class_changes(states))
    for _subtask, state in sorted(states.items()):
        if state.keyed is not None:
            restore.keyed.append(state.keyed)
        for name, entries in state.operator_lists.items():
            restore.operator_lists.setdefault(name, []).extend(entries)
        for name, entries in state.union_lists.items():
            restore.union_lists[name] = list(entries)
    return restore


def _state_check(outcome: StateOutcome, saved: _SavedState | None) -> StateCheck:
    descriptor = outcome.descriptor
    if saved is None:
        return StateCheck(
            outcome.name,
            outcome.action,
            kind=outcome.kind,
            version=descriptor.version,
            migrate_given=descriptor.migrate is not None,
            ttl=descriptor.ttl is not None,
        )
    serializer_changed = None
    if saved.serializer is not None:
        serializer_changed = not _same_serializer(saved.serializer, descriptor.value_serializer)
    return StateCheck(
        outcome.name,
        outcome.action,
        saved_kind=saved.kind,
        saved_version=saved.schema.version,
        kind=outcome.kind,
        version=descriptor.version,
        error=outcome.error,
        serializer_changed=serializer_changed,
        migrate_given=descriptor.migrate is not None,
        saved_ttl=saved.has_ttl,
        ttl=descriptor.ttl is not None,
    )


def _same_serializer(saved: Serializer, new: Serializer) -> bool:
    """Same class and settings (serializers without ``__eq__``: same attributes)."""
    if type(saved) is not type(new):
        return False
    if saved == new:
        return True
    return hasattr(saved, "__dict__") and vars(saved) == vars(new)


def _hint_renames(operators: Iterable[OperatorCheck]) -> None:
    """Mark a left-behind uid whose saved states (names and kinds; internal ones, named
    ``_...`` such as timers, aside) are exactly those a new operator declares: likely
    the same operator given another uid."""
    ops = list(operators)
    fresh = {
        op.uid: frozenset((s.name, s.kind) for s in op.states if not s.name.startswith("_"))
        for op in ops
        if op.status == "new"
    }
    for gone in (op for op in ops if op.status == "left_behind"):
        shape = frozenset((s.name, s.saved_kind) for s in gone.states if not s.name.startswith("_"))
        if not shape:
            continue
        for op in ops:
            if op.uid in fresh and fresh[op.uid] == shape and op.renamed_from is None:
                gone.renamed_to, op.renamed_from = op.uid, gone.uid
                break
