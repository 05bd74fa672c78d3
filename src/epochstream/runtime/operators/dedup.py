"""``stream.deduplicate(id_fn, ttl=...)``: each id once within ``ttl``.

The stream is keyed by the id. Per record, the operator asks an
:class:`~epochstream.state.bloom.AgingBloomFilter` first: "never seen" (most new ids)
needs no state read; "maybe seen" is settled by the exact catalog, a keyed value state
with state TTL (:mod:`epochstream.core.state_ttl`), so an entry expires ``ttl`` after the id
was seen. Both are checkpointed: the catalog as keyed state, the filter as union-list
state that a restore ORs together (so a rescale never makes the filter say "never seen"
for an id it saw). Expiry follows the job's clock (processing time).

Example::

    op = DeduplicateOperator(spec, ctx); op.open()
    op.process_batch(["a", "b", "a"], None)   # emits ["a", "b"]
"""

from __future__ import annotations

from typing import Any

from epochstream.core.state_descriptors import ValueStateDescriptor
from epochstream.core.state_ttl import TtlConfig
from epochstream.exceptions import UserFunctionError
from epochstream.graph.specs import DedupSpec
from epochstream.runtime.operators.base import Operator, SnapshotParts
from epochstream.state.backends.base import SnapshotTarget
from epochstream.state.bloom import AgingBloomFilter
from epochstream.state.handles import OperatorRestore
from epochstream.state.keyformat import encode_key

__all__ = ["DeduplicateOperator"]

BLOOM = "_dedup_bloom"


class DeduplicateOperator(Operator):
    """Emits a record only if its id was not seen within ``ttl`` (module docstring)."""

    def __init__(self, spec: Any, ctx: Any) -> None:
        super().__init__(spec, ctx)
        self._dedup: DedupSpec = spec.payload
        self._restored_filters: list[Any] = []

    def initialize_state(self, restore: OperatorRestore | None, checkpoint_id: int | None) -> None:
        super().initialize_state(restore, checkpoint_id)
        if restore is not None:
            self._restored_filters = list(restore.union_lists.get(BLOOM, []))

    def open(self) -> None:
        super().open()
        assert self.keyed is not None and self.spec.key_selector is not None
        spec = self._dedup
        now = self.ctx.clock.wall()
        self._bloom = AgingBloomFilter(
            spec.bloom_capacity, spec.bloom_fp_rate, TtlConfig.of(spec.ttl, "on_write").seconds, now
        )
        if self._restored_filters:
            self._bloom.restore(self._restored_filters)
            self._restored_filters = []
        self._seen = self.keyed.get_state(ValueStateDescriptor("_dedup_seen", ttl=spec.ttl))

    def process_batch(self, records: list[Any], timestamps: list[Any] | None) -> None:
        self.process_keyed(records, self.keys_of(records), timestamps)

    def process_keyed(
        self, records: list[Any], keys: list[Any], timestamps: list[Any] | None
    ) -> None:
        bloom, seen = self._bloom, self._seen
        set_key = self.keyed.set_current_key  # type: ignore[union-attr]
        now = self.ctx.clock.wall()
        bloom.rotate(now)
        positions_of = bloom.current.positions
        maybe, add = bloom.might_contain_positions, bloom.current.add_positions
        keep: list[int] = []
        i = 0
        try:
            for i, k in enumerate(keys):
                positions = positions_of(encode_key(k))
                set_key(k)
                # "Never seen" needs no state read; "maybe" is settled by the catalog.
                if maybe(positions) and seen.value() is not None:
                    continue
                seen.update(True)
                add(positions)
                keep.append(i)
        except Exception as exc:
            raise UserFunctionError(self.ctx.task_name, records[i], exc) from exc
        if len(keep) == len(records):
            self.output.collect(records, timestamps)
        elif keep:
            self.output.collect(
                [records[i] for i in keep],
                None if timestamps is None else [timestamps[i] for i in keep],
            )

    def snapshot(self, target: SnapshotTarget) -> SnapshotParts:
        parts = super().snapshot(target)
        return SnapshotParts(
            keyed=parts.keyed,
            operator_lists=parts.operator_lists,
            union_lists={**parts.union_lists, BLOOM: [self._bloom.snapshot()]},
        )
