"""Keyed and operator state (the ``es.state`` namespace users see).

Users create state through descriptors in ``open(ctx)``::

    self.total = ctx.get_state(es.state.ValueStateDescriptor("total", default=0))

Internally this package holds key groups (``keygroups``), the heap keyed-state
backend (``keyed``), operator list state (``operator``), snapshot handles
(``handles``) and the redistribution of state on rescale (``redistribute``).
"""

from epochstream.state.descriptors import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)

__all__ = [
    "AggregateFunction",
    "AggregatingStateDescriptor",
    "ListStateDescriptor",
    "MapStateDescriptor",
    "ReducingStateDescriptor",
    "StateDescriptor",
    "ValueStateDescriptor",
]
