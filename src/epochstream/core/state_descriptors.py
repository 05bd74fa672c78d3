"""State descriptors (Flink style): a name plus what the state needs to behave.

An operator asks its keyed state backend for state through a descriptor; the name
identifies the state in snapshots, so it must stay the same across job versions.

Example::

    class Average(AggregateFunction):
        def create_accumulator(self):
            return (0, 0)

        def add(self, value, accumulator):
            return (accumulator[0] + value, accumulator[1] + 1)

        def get_result(self, accumulator):
            return accumulator[0] / accumulator[1]

        def merge(self, a, b):
            return (a[0] + b[0], a[1] + b[1])

    count = ValueStateDescriptor("count", default=0)
    seen = ListStateDescriptor("seen")
    by_page = MapStateDescriptor("by-page")
    total = ReducingStateDescriptor("total", reduce_fn=lambda a, b: a + b)
    avg = AggregatingStateDescriptor("avg", aggregate_function=Average())
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from epochstream.core.serializers import DEFAULT_SERIALIZER, Serializer
from epochstream.core.state_ttl import TtlConfig
from epochstream.exceptions import ConfigurationError

__all__ = [
    "AggregateFunction",
    "AggregatingStateDescriptor",
    "ListStateDescriptor",
    "MapStateDescriptor",
    "ReducingStateDescriptor",
    "StateDescriptor",
    "ValueStateDescriptor",
]


class AggregateFunction(ABC):
    """Incremental aggregation: values are folded into an accumulator.

    Example::

        class Count(AggregateFunction):
            def create_accumulator(self):
                return 0

            def add(self, value, accumulator):
                return accumulator + 1

            def get_result(self, accumulator):
                return accumulator

            def merge(self, a, b):
                return a + b
    """

    @abstractmethod
    def create_accumulator(self) -> Any:
        """A new, empty accumulator."""

    @abstractmethod
    def add(self, value: Any, accumulator: Any) -> Any:
        """Fold ``value`` into ``accumulator`` and return the (possibly new) accumulator."""

    @abstractmethod
    def get_result(self, accumulator: Any) -> Any:
        """The aggregate's result for ``accumulator``."""

    @abstractmethod
    def merge(self, a: Any, b: Any) -> Any:
        """Combine two accumulators (used when merging windows or partial results)."""


@dataclass(frozen=True)
class StateDescriptor:
    """Base of all descriptors: ``name`` identifies the state within its operator.

    Keyword-only on every descriptor:

    - ``ttl``: a ``timedelta`` (or seconds) after which an entry expires (see
      :mod:`epochstream.core.state_ttl`); ``ttl_update``: ``"on_write"`` (default) or
      ``"on_read_and_write"``;
    - ``serializer``: how values are stored (default: pickle protocol 5); anything with
      ``dumps``/``loads``, e.g. :class:`~epochstream.core.serializers.JsonSerializer`;
    - ``version`` (default 1) and ``migrate``: the version of the values' schema, and
      ``migrate(value, old_version) -> value`` converting values a snapshot saved at an
      older version (see :mod:`epochstream.core.state_schema`); raise ``version`` when
      the values change shape (a dataclass field added, a tuple widened, a JSON field
      renamed).

    Example::

        ValueStateDescriptor("count", default=0, ttl=timedelta(hours=1)).name == "count"
        ValueStateDescriptor("profile", version=2, migrate=lambda old, v: Profile(old.name, None))
    """

    name: str
    ttl: Any = field(default=None, kw_only=True)
    ttl_update: str = field(default="on_write", kw_only=True)
    serializer: Serializer | None = field(default=None, kw_only=True, compare=False)
    version: int = field(default=1, kw_only=True)
    migrate: Callable[[Any, int], Any] | None = field(default=None, kw_only=True, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigurationError(f"state name must be a non-empty str, got {self.name!r}")
        if self.ttl is not None:
            TtlConfig.of(self.ttl, self.ttl_update)
        if self.serializer is not None and not isinstance(self.serializer, Serializer):
            raise ConfigurationError(
                f"state {self.name!r}: serializer needs dumps() and loads(), got {self.serializer!r}"
            )
        if not isinstance(self.version, int) or isinstance(self.version, bool) or self.version < 1:
            raise ConfigurationError(
                f"state {self.name!r}: version must be an int >= 1, got {self.version!r}"
            )
        if self.migrate is not None and not callable(self.migrate):
            raise ConfigurationError(
                f"state {self.name!r}: migrate must be a function (value, old_version) -> value, "
                f"got {self.migrate!r}"
            )

    @property
    def ttl_config(self) -> TtlConfig | None:
        """The validated TTL settings, ``None`` without ``ttl``."""
        return None if self.ttl is None else TtlConfig.of(self.ttl, self.ttl_update)

    @property
    def value_serializer(self) -> Serializer:
        """The serializer of this state's values."""
        return self.serializer if self.serializer is not None else DEFAULT_SERIALIZER


@dataclass(frozen=True)
class ValueStateDescriptor(StateDescriptor):
    """A single value per key; ``value()`` returns ``default`` (a copy) when unset.

    Example::

        ValueStateDescriptor("count", default=0)
    """

    default: Any = None


@dataclass(frozen=True)
class ListStateDescriptor(StateDescriptor):
    """A list of values per key.

    Example::

        ListStateDescriptor("events")
    """


@dataclass(frozen=True)
class MapStateDescriptor(StateDescriptor):
    """A dict of user keys to values per key.

    Example::

        MapStateDescriptor("counts-by-page")
    """


@dataclass(frozen=True)
class ReducingStateDescriptor(StateDescriptor):
    """A single value per key, combined with ``reduce_fn(old, new)`` on every ``add``.

    Example::

        ReducingStateDescriptor("sum", reduce_fn=lambda a, b: a + b)
    """

    reduce_fn: Callable[[Any, Any], Any] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not callable(self.reduce_fn):
            raise ConfigurationError(
                f"ReducingStateDescriptor {self.name!r} needs a callable reduce_fn, "
                f"got {self.reduce_fn!r}"
            )


@dataclass(frozen=True)
class AggregatingStateDescriptor(StateDescriptor):
    """A single accumulator per key, driven by an :class:`AggregateFunction`.

    Example::

        AggregatingStateDescriptor("avg", aggregate_function=Average())
    """

    aggregate_function: AggregateFunction | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        # Duck typing is accepted: any object with the four methods will do.
        missing = [
            m for m in _AGGREGATE_METHODS if not callable(getattr(self.aggregate_function, m, None))
        ]
        if missing:
            raise ConfigurationError(
                f"AggregatingStateDescriptor {self.name!r} needs an AggregateFunction; "
                f"{self.aggregate_function!r} lacks {', '.join(missing)}"
            )


_AGGREGATE_METHODS = ("create_accumulator", "add", "get_result", "merge")
