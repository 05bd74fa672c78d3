"""The job master's half of the Kafka source: partitions become splits.

At a fresh start the enumerator lists the topics (``topics``, all of which must exist,
or every topic matching ``topic_pattern``), resolves where each partition starts (``starting_offsets``) and,
for a bounded job, where it stops (the end offsets seen now). While an unbounded job
runs it lists them again every ``discovery_interval`` seconds: new partitions of known
topics and, with a pattern, new matching topics become splits, read from their start
(records written before discovery are not skipped). A listing runs on a thread of its
own, never on the job master's event loop: a broker that does not answer would block
the loop for the request's timeout, and heartbeats and checkpoint acknowledgements
queued behind it would age into "slot N missed heartbeats" and "checkpoint expired"
failures that do not name Kafka. ``discover`` starts a listing when one is due and
hands out what the previous listing found. Splits are pushed round-robin
(``assign_on_demand = False``): a partition is read forever, its reader never asks
again. The set of known partitions is the checkpointed state, so a restored job does
not hand out a partition twice.

Example::

    enum = KafkaPartitionEnumerator(source, parallelism=2, restored=None, metadata=lambda: meta)
    enum.initial_splits()      # [KafkaPartitionSplit("bids/0", ...), ...]
    enum.discover(now)         # partitions that appeared since
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from epochstream.connectors.enumerators import SplitEnumerator
from epochstream.connectors.kafka.client import KafkaClientError, Metadata
from epochstream.connectors.kafka.splits import EARLIEST, KafkaPartitionSplit, StartAtTimestamp
from epochstream.exceptions import ConfigurationError

if TYPE_CHECKING:
    from epochstream.connectors.kafka.source import KafkaSource

__all__ = ["BackgroundListing", "KafkaPartitionEnumerator", "at_once", "in_thread"]

log = logging.getLogger(__name__)

#: Seconds between looks at a listing in flight (how late a finished one is picked up).
_LISTING_POLL = 0.2


class BackgroundListing:
    """The outcome of one partition listing run by ``start`` (a result or an error).

    Example::

        listing = in_thread(lambda: [("bids", 0)])
        listing.wait(1.0); listing.done   # True
        listing.result()                  # [("bids", 0)]
    """

    def __init__(self) -> None:
        self._done = threading.Event()
        self._result: list[tuple[str, int]] = []
        self._error: BaseException | None = None

    def run(self, listing: Callable[[], list[tuple[str, int]]]) -> None:
        """Run ``listing`` here and keep what it gave or raised."""
        try:
            self._result = listing()
        except BaseException as exc:  # handed to the event loop by result(), not lost
            self._error = exc
        finally:
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    def result(self) -> list[tuple[str, int]]:
        """What the listing found; raises what it raised."""
        if self._error is not None:
            raise self._error
        return self._result


def in_thread(listing: Callable[[], list[tuple[str, int]]]) -> BackgroundListing:
    """Run ``listing`` on a daemon thread (a hung broker must not hold the driver's exit)."""
    out = BackgroundListing()
    threading.Thread(target=out.run, args=(listing,), name="kafka-discovery", daemon=True).start()
    return out


def at_once(listing: Callable[[], list[tuple[str, int]]]) -> BackgroundListing:
    """Run ``listing`` in the caller (tests: ``discover`` then finds in one call)."""
    out = BackgroundListing()
    out.run(listing)
    return out


class KafkaPartitionEnumerator(SplitEnumerator):
    """Lists partitions and hands new ones out as splits (module docstring).

    Example: ``KafkaPartitionEnumerator(src, 2, None, lambda: meta).snapshot()  # [("bids", 0), ...]``
    """

    assign_on_demand = False

    def __init__(
        self,
        source: KafkaSource,
        parallelism: int,
        restored: Any,
        metadata: Callable[[], Metadata],
        discovery_metadata: Callable[[], Metadata] | None = None,
        start: Callable[[Callable[[], list[tuple[str, int]]]], BackgroundListing] = in_thread,
    ) -> None:
        self._source = source
        # A client per use, closed right after: the enumerator has no close hook, and
        # listing every few seconds costs less than a connection held for the job's life.
        self._connect = metadata
        # Discovery runs on the job master's event loop: its requests time out sooner.
        self._connect_discovery = discovery_metadata or metadata
        self._known: set[tuple[str, int]] = {(str(t), int(p)) for t, p in restored or []}
        self._pattern = re.compile(source.topic_pattern) if source.topic_pattern else None
        self._due: float | None = None
        # Off the event loop (module docstring); tests pass a runner that lists at once.
        self._start = start
        self._listing: BackgroundListing | None = None
        self._polled = 0.0  # when discover last looked

    def _listed(self, meta: Metadata) -> list[tuple[str, int]]:
        """Every partition of the source's topics that exists now, in order."""
        if self._pattern is None:
            counts = meta.partitions(list(self._source.topics))
        else:
            pattern = self._pattern
            counts = {t: n for t, n in meta.partitions(None).items() if pattern.fullmatch(t)}
        return sorted((t, p) for t, n in counts.items() for p in range(n))

    def initial_splits(self) -> list[Any]:
        """Every partition now, at ``starting_offsets`` (and, if bounded, its end now)."""
        meta = self._connect()
        try:
            partitions = self._listed(meta)
            self._check_named_partitions_exist(partitions)
            starts = self._starts(meta, partitions)
            stops = meta.end_offsets(partitions) if self._source.bounded else {}
        finally:
            meta.close()
        self._known.update(partitions)
        return [
            KafkaPartitionSplit.of(t, p, starts[(t, p)], stops.get((t, p))) for t, p in partitions
        ]

    def _check_named_partitions_exist(self, partitions: list[tuple[str, int]]) -> None:
        # A named topic that is not there is a typo or a missing setup step far more
        # often than a race with its creation: fail at once, as Flink's KafkaSource does,
        # instead of reading nothing (a bounded job would end "successfully").
        found = {t for t, _ in partitions}
        missing = [t for t in self._source.topics if t not in found]
        if missing:
            raise ConfigurationError(
                f"KafkaSource: topic(s) {missing} do not exist on "
                f"{self._source.bootstrap_servers} (create them first, or use topic_pattern= "
                "to read topics that appear while the job runs)"
            )
        spec = self._source.starting_offsets
        if isinstance(spec, dict):
            listed = set(partitions)
            absent = sorted(tp for tp in spec if tp not in listed)
            if absent:
                raise ConfigurationError(
                    f"KafkaSource starting_offsets names partition(s) {absent} that do not exist "
                    f"on {self._source.bootstrap_servers}"
                )

    def _starts(
        self, meta: Metadata, partitions: list[tuple[str, int]]
    ) -> dict[tuple[str, int], int]:
        spec = self._source.starting_offsets
        if spec == "earliest":
            if self._source.bounded:  # a real offset, to compare with the stop offset
                return meta.start_offsets(partitions)
            return dict.fromkeys(partitions, EARLIEST)
        if spec == "latest":
            return meta.end_offsets(partitions)
        if isinstance(spec, dict):
            # Partitions not named start at their log start.
            missing = [tp for tp in partitions if tp not in spec]
            first = meta.start_offsets(missing) if missing else {}
            return {tp: int(spec[tp]) if tp in spec else first[tp] for tp in partitions}
        assert isinstance(spec, StartAtTimestamp)  # checked by KafkaSource
        return meta.offsets_for_time(partitions, spec.ms)

    def discover(self, now: float) -> list[Any]:
        """New partitions (of known or newly matching topics), read from their start:
        starts a listing when one is due, returns what a finished listing found."""
        if self._source.bounded:
            return []
        self._polled = now
        if self._listing is None and (self._due is None or now >= self._due):
            self._listing = self._start(self._list_for_discovery)
        listing = self._listing
        if listing is None or not listing.done:
            return []
        self._listing = None
        # Counted from the listing's end: a listing that used its whole timeout (a broker
        # that is away) is not followed by the next one at once.
        self._due = now + self._source.discovery_interval
        try:
            listed = listing.result()
        except KafkaClientError as exc:
            # The known partitions read on regardless; a broker that does not answer
            # now is asked again at the next interval (and readers fail on their own
            # if it stays away).
            log.warning(
                "Kafka partition discovery failed, retrying in %.1f s: %s",
                self._source.discovery_interval,
                exc,
            )
            return []
        # _known changes here only, on the event loop: snapshots see whole listings.
        new = [tp for tp in listed if tp not in self._known]
        self._known.update(new)
        return [KafkaPartitionSplit.of(t, p, EARLIEST) for t, p in new]

    def _list_for_discovery(self) -> list[tuple[str, int]]:
        meta = self._connect_discovery()
        try:
            return self._listed(meta)
        finally:
            meta.close()

    def next_discovery(self) -> float | None:
        if self._source.bounded:
            return None
        if self._listing is not None:
            # Looked at again soon: what it finds is handed out without waiting an interval.
            return self._polled + _LISTING_POLL
        return 0.0 if self._due is None else self._due

    def snapshot(self) -> Any:
        """The partitions handed out so far, as sorted ``[topic, partition]`` pairs."""
        return sorted(self._known)
