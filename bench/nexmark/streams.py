"""The Nexmark events as one stream per kind, as the queries of ``queries.py`` (rows)
and ``columnar.py`` (Arrow batches) read them.

A kind's source is created the first time a query asks for it, so a query reads only
the kinds it needs (q3 and q8 never read a bid), as the peers' SQL does over its
person, auction and bid tables. Every stream has event time from ``date_time`` and
watermarks 4 s behind the largest seen.

Example::

    streams = NexmarkStreams.generated(env, es.sources.nexmark.NexmarkConfig(events=1_000_000))
    bids = streams.of("bid")             # dicts of a bid's fields
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import epochstream as es

__all__ = ["KINDS", "WATERMARK_BOUND_MS", "NexmarkStreams"]

KINDS = ("person", "auction", "bid")
WATERMARK_BOUND_MS = 4_000


def _date_time(event: dict[str, Any]) -> int:
    return event["date_time"]


def _strategy(columnar: bool) -> es.WatermarkStrategy:
    bound = es.WatermarkStrategy.bounded_out_of_orderness(WATERMARK_BOUND_MS)
    if columnar:
        return bound.with_timestamp_column("date_time")
    return bound.with_timestamp_assigner(_date_time)


class NexmarkStreams:
    """One stream per event kind (``person``, ``auction``, ``bid``), rows (dicts of
    the kind's fields) or, with ``columnar``, Arrow batches of the kind's columns.

    ``make(kind, strategy)`` creates a kind's stream with the given watermark strategy;
    the classmethods are the usual ones. ``name`` prefixes the streams' uids (two sets of
    streams in one job need two names).

    Example: ``NexmarkStreams(lambda kind, wm: env.from_source(src[kind], watermark_strategy=wm))``
    """

    def __init__(
        self,
        make: Callable[[str, es.WatermarkStrategy], es.DataStream],
        *,
        columnar: bool = False,
        name: str = "nexmark",
    ) -> None:
        self._make = make
        self.columnar = columnar
        self.name = name
        self._streams: dict[str, es.DataStream] = {}

    @classmethod
    def generated(
        cls,
        env: es.Environment,
        config: es.sources.nexmark.NexmarkConfig,
        *,
        columnar: bool = False,
        batch_size: int = 65_536,
        rate: float | None = None,
        name: str = "nexmark",
    ) -> NexmarkStreams:
        """The deterministic generator's events (``es.sources.NexmarkSource(kind=...)``);
        ``rate``: positions/s of each kind's source.

        Example: ``NexmarkStreams.generated(env, es.sources.nexmark.NexmarkConfig(events=1_000_000), columnar=True)``
        """

        def make(kind: str, strategy: es.WatermarkStrategy) -> es.DataStream:
            source = es.sources.NexmarkSource(
                config, kind=kind, batch_size=batch_size if columnar else None, rate=rate
            )
            return env.from_source(source, name=f"{name}-{kind}", watermark_strategy=strategy)

        return cls(make, columnar=columnar, name=name)

    @classmethod
    def from_files(
        cls, env: es.Environment, directory: str, *, columnar: bool = False, name: str = "nexmark"
    ) -> NexmarkStreams:
        """The events of ``es.sources.nexmark.write_nexmark_files``' ``<kind>.parquet`` files.

        Example: ``NexmarkStreams.from_files(env, "/tmp/nexmark-1m")``
        """

        def make(kind: str, strategy: es.WatermarkStrategy) -> es.DataStream:
            path = os.path.join(directory, f"{kind}.parquet")
            if columnar:
                return env.from_parquet(path, watermark_strategy=strategy)
            return env.from_files(path, "parquet", watermark_strategy=strategy)

        return cls(make, columnar=columnar, name=name)

    def used(self) -> list[str]:
        """The kinds asked for so far, in ``KINDS`` order (the last is the most frequent).

        Example: ``q3(streams); streams.used() == ["person", "auction"]``
        """
        return [kind for kind in KINDS if kind in self._streams]

    def of(self, kind: str) -> es.DataStream:
        """The stream of ``kind``'s events. Example: ``streams.of("auction")``"""
        if kind not in KINDS:
            raise ValueError(f"no Nexmark event kind {kind!r}; choose among {KINDS}")
        if kind not in self._streams:
            form = "batches" if self.columnar else "rows"
            self._streams[kind] = self._make(kind, _strategy(self.columnar)).uid(
                f"{self.name}-{kind}-{form}"
            )
        return self._streams[kind]
