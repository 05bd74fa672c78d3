"""Keyed and operator state (the ``es.state`` namespace users see).

Users create state through descriptors in ``open(ctx)``::

    self.total = ctx.get_state(es.state.ValueStateDescriptor("total", default=0))

and choose where keyed state lives with ``env.set_state_backend(...)``:
:class:`HeapStateBackend` (default; Python objects, incremental snapshots) or
:class:`RocksDBStateBackend` (on the slot's local disk, larger than memory).

Internally this package holds the stored key format (``keyformat``), key groups
(``keygroups``), the backends (``backends/``), operator list state (``operator``),
snapshot handles (``handles``), the canonical savepoint format (``canonical``) and the
redistribution of state on rescale (``redistribute``).
"""

from epochstream.core.serializers import JsonSerializer, PickleSerializer, Serializer
from epochstream.core.state_descriptors import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from epochstream.state.backends.base import StateBackend
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend
from epochstream.state.states import (
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    ValueState,
)

__all__ = [
    "AggregateFunction",
    "AggregatingState",
    "AggregatingStateDescriptor",
    "HeapStateBackend",
    "JsonSerializer",
    "ListState",
    "ListStateDescriptor",
    "MapState",
    "MapStateDescriptor",
    "PickleSerializer",
    "ReducingState",
    "ReducingStateDescriptor",
    "RocksDBStateBackend",
    "Serializer",
    "StateBackend",
    "StateDescriptor",
    "ValueState",
    "ValueStateDescriptor",
]
