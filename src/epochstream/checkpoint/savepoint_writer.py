"""Writing and changing savepoints offline (``es.savepoint.load`` / ``es.savepoint.new``).

A :class:`Savepoint` is a plan for a savepoint directory: the operators it will hold
(by uid), each with its keyed states, operator list states and union list states. It
starts from a savepoint or retained checkpoint (:func:`load`, which is only read) or
empty (:func:`new`), is changed by its methods, and is written by :meth:`Savepoint.write`
into a new directory any job can start from (``execute(..., from_savepoint=path)``).

The plan is lazy: the methods record what to do (and check what they can at once: uids,
state names, kinds); nothing is read or written before :meth:`~Savepoint.write`. They
change the Savepoint they are called on and return it, so calls chain. Writing:

- an operator with nothing changed has its files copied as they are (any format), and
  its handles rewritten to the copies, so the savepoint is self-contained; a
  checkpoint's heap or RocksDB keyed state of value, list and map kinds is rewritten in
  the canonical format instead, so the savepoint restores into either backend;
- an operator whose keyed state changed is rewritten in the canonical format: every
  state's rows are produced batch by batch (:mod:`epochstream.checkpoint.savepoint_states`),
  spilled to local files by key-group range and written as one file per range with one
  record batch per key group (:mod:`epochstream.checkpoint.keygroup_spill`): memory holds
  one input batch while reading and one range (at most ``memory_budget`` bytes, or one
  key group) while writing. Ranges are those of the operator's parallelism, so a job
  restored at that parallelism reads one file per subtask;
- operator list state is split round-robin over the operator's subtasks (as a restore
  at another parallelism would), union list state is kept once.

Example::

    new = es.savepoint.new(max_parallelism=128)
    new.with_keyed_state("counter", "count", table, key="word", value="n")
    new.write("/sp/bootstrapped")

    sp = es.savepoint.load("/sp/bootstrapped")
    sp.transform("counter", "count", lambda b: b.set_column(1, "value", pc.multiply(b["value"], 2)))
    sp.write("/sp/doubled")
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from epochstream.checkpoint.keygroup_spill import DEFAULT_MEMORY_BUDGET, KeyGroupSpill
from epochstream.checkpoint.metadata import CheckpointMetadata
from epochstream.checkpoint.reader import read
from epochstream.checkpoint.savepoint_states import (
    BootstrappedState,
    Column,
    KeyedStateSource,
    MappedValues,
    SavedState,
    TransformedState,
    checked_version,
    is_regroupable,
)
from epochstream.checkpoint.snapshot_copies import SnapshotCopies
from epochstream.checkpoint.storage import (
    METADATA_FILE,
    find_completed_checkpoints,
    load_metadata,
    write_metadata_file,
)
from epochstream.core.checkpoint_stats import KIND_SAVEPOINT, CheckpointStats
from epochstream.core.filesystems import ensure_private_location, normalize_location, storage_fs
from epochstream.core.serializers import DEFAULT_SERIALIZER, Serializer
from epochstream.core.state_schema import StateSchema
from epochstream.exceptions import CheckpointError, ConfigurationError, StateError
from epochstream.state.handles import (
    CanonicalSnapshotHandle,
    KeyedStateHandle,
    OperatorSubtaskState,
    saved_schemas,
)
from epochstream.state.keygroups import key_group_range_for_operator, validate_max_parallelism
from epochstream.state.redistribute import merge_union_lists, redistribute_operator_lists

__all__ = ["OperatorInfo", "Savepoint", "load", "new"]

#: ``job_id`` of a savepoint written from scratch.
_NEW_JOB_ID = "savepoint-writer"


@dataclass(frozen=True)
class OperatorInfo:
    """What a savepoint holds of one operator.

    ``keyed_states`` maps each keyed state to its kind (``value``, ``list``, ``map``,
    ``ns-value``/``ns-list`` for window contents and timers, ``columnar``, ``rows``);
    ``key_groups`` are the key groups its keyed state files cover.

    Example::

        info = es.savepoint.load(path).operators["counter"]
        info.keyed_states == {"_reduce": "value"} and info.parallelism == 2
    """

    uid: str
    parallelism: int
    keyed_states: dict[str, str]
    operator_states: tuple[str, ...]
    union_states: tuple[str, ...]
    key_groups: tuple[range, ...]


@dataclass
class _OperatorPlan:
    """One operator of the savepoint to write.

    ``keyed`` is ``None`` while the saved keyed state (``saved``, by source subtask) is
    unchanged, else every keyed state to write. ``lists``/``unions`` hold the operator
    and union list states per subtask (``parallelism`` entries).
    """

    parallelism: int
    saved: dict[int, KeyedStateHandle] = field(default_factory=dict)
    keyed: dict[str, KeyedStateSource] | None = None
    lists: list[dict[str, list[Any]]] = field(default_factory=list)
    unions: list[dict[str, list[Any]]] = field(default_factory=list)

    def saved_kinds(self) -> dict[str, str]:
        kinds: dict[str, str] = {}
        for handle in self.saved.values():
            kinds.update(getattr(handle, "states", {}))
        return kinds

    def kinds(self) -> dict[str, str]:
        if self.keyed is None:
            return self.saved_kinds()
        return {name: source.kind for name, source in self.keyed.items()}

    def convertible(self) -> bool:
        """The saved keyed state is a checkpoint's (not canonical) and can be rewritten
        in the canonical format."""
        handles = list(self.saved.values())
        return any(type(h) is not CanonicalSnapshotHandle for h in handles) and all(
            is_regroupable(kind) for kind in self.saved_kinds().values()
        )


class Savepoint:
    """A savepoint to write, loaded from one or empty (see the module docstring).

    Every method but the ``read_*`` ones and :meth:`write` changes this Savepoint and
    returns it. Example::

        sp = es.savepoint.load("/sp/savepoint-1")
        sp.drop_operator("old-uid").rename_operator("counter", "counter-v2").write("/sp/v2")
    """

    def __init__(
        self,
        *,
        max_parallelism: int,
        parallelism: int = 1,
        source: str | None = None,
        metadata: CheckpointMetadata | None = None,
        storage_options: Any = None,
        trust_shared_storage: bool = False,
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
    ) -> None:
        self._max_parallelism = validate_max_parallelism(max_parallelism)
        self._parallelism = parallelism
        self._source = source
        self._metadata = metadata
        self._options = storage_options
        self._trust_shared = trust_shared_storage
        self.memory_budget = memory_budget
        self._source_max_parallelism = max_parallelism
        self._plans: dict[str, _OperatorPlan] = {}
        if metadata is not None:
            for uid, subtasks in metadata.operators.items():
                self._plans[uid] = self._saved_plan(metadata, uid, subtasks)

    @staticmethod
    def _saved_plan(
        md: CheckpointMetadata, uid: str, subtasks: dict[int, OperatorSubtaskState]
    ) -> _OperatorPlan:
        parallelism = md.operator_parallelism.get(uid, md.parallelism)
        empty = OperatorSubtaskState()
        states = [subtasks.get(i, empty) for i in range(parallelism)]
        return _OperatorPlan(
            parallelism=parallelism,
            saved={i: s.keyed for i, s in subtasks.items() if s.keyed is not None},
            lists=[dict(s.operator_lists) for s in states],
            unions=[dict(s.union_lists) for s in states],
        )

    def __repr__(self) -> str:
        return (
            f"Savepoint(source={self._source!r}, max_parallelism={self._max_parallelism}, "
            f"operators={sorted(self._plans)})"
        )

    # ------------------------------------------------------------------ reading

    @property
    def max_parallelism(self) -> int:
        """The number of key groups (fixed for the life of the state)."""
        return self._max_parallelism

    @property
    def operators(self) -> dict[str, OperatorInfo]:
        """Every operator the savepoint will hold, by uid (pending changes included)."""
        out = {}
        for uid, plan in sorted(self._plans.items()):
            lists = sorted({n for part in plan.lists for n in part})
            unions = sorted({n for part in plan.unions for n in part})
            if plan.keyed is None:
                ranges = tuple(sorted((h.key_groups for h in plan.saved.values()), key=_start))
            elif plan.keyed:
                ranges = (range(0, self._max_parallelism),)
            else:
                ranges = ()
            out[uid] = OperatorInfo(
                uid=uid,
                parallelism=plan.parallelism,
                keyed_states=dict(sorted(plan.kinds().items())),
                operator_states=tuple(lists),
                union_states=tuple(unions),
                key_groups=ranges,
            )
        return out

    def _loaded(self, what: str) -> tuple[str, CheckpointMetadata]:
        if self._source is None or self._metadata is None:
            raise StateError(f"{what} reads a loaded savepoint; this one was made with new()")
        return self._source, self._metadata

    def read_keyed_state(self, uid: str, name: str) -> pa.Table:
        """Keyed state ``name`` of operator ``uid`` as loaded (pending changes are not
        applied), as :func:`epochstream.checkpoint.reader.read` gives it.

        Example: ``es.savepoint.load(path).read_keyed_state("counter", "count").to_pandas()``
        """
        source, _md = self._loaded("read_keyed_state")
        return read(
            source,
            uid,
            name,
            storage_options=self._options,
            trust_shared_storage=self._trust_shared,
        )

    def read_operator_state(self, uid: str, name: str) -> list[Any]:
        """Operator (or union) list state ``name`` of ``uid`` as loaded: the elements of
        every subtask, in subtask order.

        Example: ``es.savepoint.load(path).read_operator_state("source", "offsets")``
        """
        source, md = self._loaded("read_operator_state")
        subtasks = md.operators.get(uid)
        if subtasks is None:
            raise StateError(
                f"{source}: no operator with uid {uid!r}; it has {sorted(md.operators)}"
            )
        states = [subtasks[i] for i in sorted(subtasks)]
        found = merge_union_lists([s.operator_lists for s in states])
        found.update(merge_union_lists([s.union_lists for s in states]))
        names = {n for s in states for n in (*s.operator_lists, *s.union_lists)}
        if name not in names:
            raise StateError(
                f"{source}: operator {uid!r} has no operator state {name!r}; it has {sorted(names)}"
            )
        return found.get(name, [])

    # ------------------------------------------------------------------ changing

    def _plan(self, uid: str) -> _OperatorPlan:
        plan = self._plans.get(uid)
        if plan is None:
            raise StateError(
                f"no operator with uid {uid!r}; the savepoint has {sorted(self._plans)}"
            )
        return plan

    def _new_plan(self, uid: str) -> _OperatorPlan:
        if not isinstance(uid, str) or not uid:
            raise ConfigurationError(f"an operator uid must be a non-empty string, got {uid!r}")
        plan = self._plans.get(uid)
        if plan is None:
            p = min(self._parallelism, self._max_parallelism)
            plan = self._plans[uid] = _OperatorPlan(
                parallelism=p, keyed={}, lists=[{} for _ in range(p)], unions=[{} for _ in range(p)]
            )
        return plan

    def _sources(self, uid: str, plan: _OperatorPlan) -> dict[str, KeyedStateSource]:
        """The plan's keyed states as sources (the saved ones read from the source)."""
        if plan.keyed is None:
            handles = [plan.saved[i] for i in sorted(plan.saved)]
            schemas = saved_schemas(handles)
            plan.keyed = {
                name: SavedState(
                    uid,
                    name,
                    kind,
                    handles,
                    max_parallelism=self._source_max_parallelism,
                    schema=schemas[name],
                    storage_options=self._options,
                )
                for name, kind in sorted(plan.saved_kinds().items())
            }
        return plan.keyed

    def with_keyed_state(
        self,
        uid: str,
        name: str,
        data: Any,
        *,
        key: Column,
        value: Column | None = None,
        user_key: Column | None = None,
        kind: str = "value",
        serializer: Serializer | None = None,
        version: int = 1,
        ttl_ts: Column | float | None = None,
    ) -> Savepoint:
        """Set keyed state ``name`` of operator ``uid`` (added if new) from ``data``: a
        pyarrow Table, RecordBatch or Dataset, a pandas or Polars DataFrame, or an
        iterable of record batches (read once, in batches, at :meth:`write`).

        ``key``, ``value`` and ``user_key`` each take a column name, a list of names
        (their values as a tuple) or a function of the row as a dict; ``value=None``
        stores each row as a dict. ``kind``: ``"value"`` (one row per key; a repeated
        key is an error), ``"list"`` (each row one element, in input order) or
        ``"map"`` (``user_key`` gives the map's keys). Keys are stored as the job's
        ``key_by`` stores the same Python values (Arrow strings as ``str``, integers
        as ``int``), values serialized with ``serializer`` (default: pickle, as a
        job's state descriptors). ``version`` is the state's schema version (the
        descriptor's ``version=``). ``ttl_ts``, for a state the job gives a TTL: each
        row's last update in wall-clock seconds (a column, or one time such as
        ``time.time()`` for every row). A state with this name is replaced.

        Example::

            new.with_keyed_state("counter", "count", pa.table({"word": ["a"], "n": [3]}),
                                 key="word", value="n")
        """
        plan = self._new_plan(uid)
        sources = self._sources(uid, plan)
        sources[name] = BootstrappedState(
            uid,
            name,
            data,
            key=key,
            value=value,
            user_key=user_key,
            kind=kind,
            serializer=serializer if serializer is not None else DEFAULT_SERIALIZER,
            version=version,
            ttl_ts=ttl_ts,
        )
        return self

    def with_operator_state(
        self, uid: str, name: str, rows: Iterable[Any], *, union: bool = False
    ) -> Savepoint:
        """Set operator list state ``name`` of ``uid`` (added if new) to ``rows``: split
        round-robin over the operator's subtasks, or with ``union=True`` union list state
        (every restoring subtask gets all rows). A list state with this name is replaced.

        Example: ``new.with_operator_state("source", "offsets", [("topic", 0, 42)])``
        """
        plan = self._new_plan(uid)
        values = list(rows)
        self._remove_lists(plan, name)
        if union:
            plan.unions[0][name] = values
        else:
            for i, part in enumerate(plan.lists):
                if values[i :: plan.parallelism]:
                    part[name] = values[i :: plan.parallelism]
        return self

    @staticmethod
    def _remove_lists(plan: _OperatorPlan, name: str) -> bool:
        found = False
        for part in (*plan.lists, *plan.unions):
            found = part.pop(name, None) is not None or found
        return found

    def _regroupable_source(
        self, uid: str, name: str, what: str
    ) -> tuple[dict[str, KeyedStateSource], KeyedStateSource]:
        plan = self._plan(uid)
        sources = self._sources(uid, plan)
        source = sources.get(name)
        if source is None:
            raise StateError(
                f"operator {uid!r} has no keyed state {name!r}; it has {sorted(sources)}"
            )
        if not is_regroupable(source.kind):
            raise StateError(
                f"operator {uid!r}, state {name!r}: {what} takes value, list and map state "
                f"(also of windows and timers), not {source.kind} state"
            )
        return sources, source

    def transform(
        self,
        uid: str,
        name: str,
        fn: Callable[[pa.RecordBatch], Any],
        *,
        version: int | None = None,
    ) -> Savepoint:
        """Pass keyed state ``name`` of ``uid`` through ``fn``, batch by batch: ``fn``
        takes a ``pyarrow.RecordBatch`` with the columns ``read_keyed_state`` gives
        (``key``, ``value``, ``namespace``, ``user_key``, ``ttl_ts``) and returns a
        RecordBatch or Table with at least ``key`` and ``value`` (map state:
        ``user_key``). Rows it leaves out are deleted; changed keys move to their key
        groups. Values Arrow cannot hold (mixed types, your classes): :meth:`map_values`.
        ``version``: the schema version to record for the state (default: as saved), so
        values migrated offline restore into a descriptor of that version without
        ``migrate=``.

        Example::

            sp.transform("counter", "count",
                         lambda b: b.set_column(1, "value", pc.multiply(b["value"], 2)))
        """
        sources, base = self._regroupable_source(uid, name, "transform")
        sources[name] = TransformedState(base, fn, version=self._version(uid, name, version))
        return self

    def map_values(
        self, uid: str, name: str, fn: Callable[[Any], Any], *, version: int | None = None
    ) -> Savepoint:
        """Replace every value of keyed state ``name`` of ``uid`` (list state: element;
        map state: map value) by ``fn(value)``, Python objects in and out; ``version``
        as for :meth:`transform`.

        Example: ``sp.map_values("word-counts", "_reduce", lambda t: (t[0], t[1] * 2))``
        """
        sources, base = self._regroupable_source(uid, name, "map_values")
        sources[name] = MappedValues(base, fn, version=self._version(uid, name, version))
        return self

    @staticmethod
    def _version(uid: str, name: str, version: int | None) -> int | None:
        if version is None:
            return None
        return checked_version(version, f"operator {uid!r}, state {name!r}")

    def drop_operator(self, uid: str) -> Savepoint:
        """Leave operator ``uid`` and all its state out.

        Example: ``sp.drop_operator("old-uid")``
        """
        self._plan(uid)
        del self._plans[uid]
        return self

    def rename_operator(self, old: str, new: str) -> Savepoint:
        """Give operator ``old``'s state to uid ``new`` (which must not exist).

        Example: ``sp.rename_operator("counter", "counter-v2")``
        """
        plan = self._plan(old)
        if new in self._plans:
            raise StateError(f"cannot rename operator {old!r} to {new!r}: {new!r} exists")
        if not isinstance(new, str) or not new:
            raise ConfigurationError(f"an operator uid must be a non-empty string, got {new!r}")
        for source in (plan.keyed or {}).values():
            source.uid = new
        self._plans[new] = self._plans.pop(old)
        return self

    def drop_state(self, uid: str, name: str) -> Savepoint:
        """Leave state ``name`` (keyed, operator or union list state) of ``uid`` out.

        Example: ``sp.drop_state("counter", "old-count")``
        """
        plan = self._plan(uid)
        found = self._remove_lists(plan, name)
        if name in plan.kinds():
            del self._sources(uid, plan)[name]
            found = True
        if not found:
            raise StateError(f"operator {uid!r} has no state {name!r}")
        return self

    def with_max_parallelism(self, max_parallelism: int) -> Savepoint:
        """Move every keyed state to ``max_parallelism`` key groups (keys re-grouped
        from their stored bytes). Columnar aggregation state and row tables are filed by
        key group by their operators and are refused; an operator's parallelism above
        the new value is lowered to it (its list states split again).

        Example: ``sp.with_max_parallelism(256)``
        """
        validate_max_parallelism(max_parallelism)
        for uid, plan in sorted(self._plans.items()):
            fixed = sorted(n for n, k in plan.kinds().items() if not is_regroupable(k))
            if fixed:
                raise StateError(
                    f"cannot change max parallelism to {max_parallelism}: operator {uid!r} "
                    f"has state {fixed} ({plan.kinds()[fixed[0]]}) that is kept by key group"
                )
        for uid, plan in self._plans.items():
            self._sources(uid, plan)
            if plan.parallelism > max_parallelism:
                plan.lists = redistribute_operator_lists(plan.lists, max_parallelism)
                merged = merge_union_lists(plan.unions)
                plan.unions = [merged] + [{} for _ in range(max_parallelism - 1)]
                plan.parallelism = max_parallelism
        self._max_parallelism = max_parallelism
        return self

    # ------------------------------------------------------------------ writing

    def write(self, path: str, *, scratch_dir: str | None = None) -> str:
        """Write the savepoint into the new directory ``path`` (local or ``s3://``; a
        directory holding a ``_metadata`` is refused) and return its location.
        ``_metadata`` is written last: a write that fails leaves files but no savepoint
        (delete the directory, or write into it again). Rewritten keyed state is spilled
        to local files in ``scratch_dir`` (default: the system's temporary directory),
        about the size of the state written.

        Example: ``es.savepoint.new().with_operator_state("src", "pos", [1]).write("/sp/a")``
        """
        path = normalize_location(path)
        fs = storage_fs(path, self._options)
        if fs.exists(fs.join(path, METADATA_FILE)):
            raise CheckpointError(
                f"{path} already holds a savepoint or checkpoint ({METADATA_FILE})"
            )
        ensure_private_location(path, what="savepoint", trust_shared=self._trust_shared)
        fs.makedirs(path)
        started = time.time()
        copies = SnapshotCopies(fs, path, storage_options=self._options)
        operators: dict[str, dict[int, OperatorSubtaskState]] = {}
        size = 0
        for index, (uid, plan) in enumerate(sorted(self._plans.items())):
            prefix = f"{index:03d}-{re.sub(r'[^A-Za-z0-9._-]+', '_', uid)[:60]}"
            if plan.keyed is None and plan.convertible():
                self._sources(uid, plan)
            if plan.keyed is None:
                keyed = {i: copies.copy(h, prefix=f"{prefix}-{i}") for i, h in plan.saved.items()}
            else:
                keyed = self._write_keyed(fs, path, prefix, uid, plan, scratch_dir)
            size += sum(h.size for h in keyed.values())
            operators[uid] = {
                i: OperatorSubtaskState(
                    keyed=keyed.get(i), operator_lists=plan.lists[i], union_lists=plan.unions[i]
                )
                for i in range(plan.parallelism)
            }
        done = time.time()
        md = self._metadata
        checkpoint_id = md.checkpoint_id if md is not None else 1
        parallelism = {uid: plan.parallelism for uid, plan in self._plans.items()}
        write_metadata_file(
            fs,
            path,
            CheckpointMetadata(
                job_id=md.job_id if md is not None else _NEW_JOB_ID,
                job_name=md.job_name if md is not None else "",
                checkpoint_id=checkpoint_id,
                kind=KIND_SAVEPOINT,
                trigger_time=started,
                completion_time=done,
                parallelism=max(parallelism.values(), default=1),
                max_parallelism=self._max_parallelism,
                operators=operators,
                operator_parallelism=parallelism,
                stats=CheckpointStats(
                    checkpoint_id=checkpoint_id,
                    trigger_time=started,
                    duration=done - started,
                    state_size=size,
                    kind=KIND_SAVEPOINT,
                ),
            ),
        )
        return path

    def _write_keyed(
        self,
        fs: Any,
        directory: str,
        prefix: str,
        uid: str,
        plan: _OperatorPlan,
        scratch_dir: str | None,
    ) -> dict[int, KeyedStateHandle]:
        sources = plan.keyed or {}
        if not sources:
            return {}
        mp = self._max_parallelism
        ranges = [
            key_group_range_for_operator(mp, plan.parallelism, i) for i in range(plan.parallelism)
        ]
        metas = {name: source.meta() for name, source in sources.items()}
        with KeyGroupSpill(
            uid=uid,
            states=metas,
            ranges=ranges,
            memory_budget=self.memory_budget,
            scratch_dir=scratch_dir,
        ) as spill:
            for source in sources.values():
                for batch in source.batches(mp):
                    spill.add(batch)
            handles = spill.write(fs, directory, prefix)
        schemas = {name: source.schema() for name, source in sources.items()}
        return {i: _with_schemas(h, schemas) for i, h in enumerate(handles)}


def _with_schemas(
    handle: CanonicalSnapshotHandle, schemas: dict[str, StateSchema]
) -> KeyedStateHandle:
    return replace(handle, schemas=schemas)


def _start(r: range) -> int:
    return r.start


def load(
    path: str, *, storage_options: Any = None, trust_shared_storage: bool = False
) -> Savepoint:
    """A :class:`Savepoint` starting from the savepoint or retained checkpoint at
    ``path``, or the newest completed checkpoint in a job's checkpoint directory (only
    read: :meth:`Savepoint.write` writes elsewhere). A local ``path`` other local users
    could change is refused unless ``trust_shared_storage=True``.

    Example::

        sp = es.savepoint.load("/sp/savepoint-3f2a9c-1b2c3d4e5f60")
        sp.operators["counter"].keyed_states    # {"count": "value"}
    """
    found = find_completed_checkpoints(path, storage_options, trust_shared=trust_shared_storage)
    if not found:  # say why (no _metadata, unreadable), as a restore would
        load_metadata(path, storage_options, trust_shared=trust_shared_storage)
    jobs = sorted({md.job_id for _d, md in found})
    if len(jobs) > 1:
        raise CheckpointError(
            f"{path} holds checkpoints of several jobs ({jobs}); give one job's directory"
        )
    directory, md = max(found, key=lambda entry: entry[1].checkpoint_id)
    in_flight = sorted(
        uid for uid, states in md.operators.items() if any(s.channel for s in states.values())
    )
    if in_flight:
        # A savepoint written from it would leave those records behind: they are part of
        # the job's state only together with that checkpoint.
        raise CheckpointError(
            f"{directory} is an unaligned checkpoint: it holds records in flight (channel "
            f"state of {', '.join(in_flight)}), which a savepoint cannot carry; take a "
            "savepoint of the running job (savepoints are aligned) and edit that"
        )
    return Savepoint(
        max_parallelism=md.max_parallelism,
        parallelism=md.parallelism,
        source=directory,
        metadata=md,
        storage_options=storage_options,
        trust_shared_storage=trust_shared_storage,
    )


def new(
    max_parallelism: int = 128,
    *,
    parallelism: int = 1,
    storage_options: Any = None,
    trust_shared_storage: bool = False,
) -> Savepoint:
    """An empty :class:`Savepoint` for a job that has never run.

    ``max_parallelism``: the job's number of key groups (a job started from the
    savepoint adopts it, or must set the same). ``parallelism``: how many state files
    per operator (a job restores at any parallelism; at this one each subtask reads
    one file). ``storage_options``: for an ``s3://`` target.

    Example::

        new = es.savepoint.new(max_parallelism=128)
        new.with_keyed_state("counter", "count", df, key="word", value="n").write("/sp/boot")
    """
    validate_max_parallelism(max_parallelism)
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
        raise ConfigurationError(f"parallelism must be an int >= 1, got {parallelism!r}")
    return Savepoint(
        max_parallelism=max_parallelism,
        parallelism=min(parallelism, max_parallelism),
        storage_options=storage_options,
        trust_shared_storage=trust_shared_storage,
    )
