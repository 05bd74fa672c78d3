"""Waiting out a checkpoint storage outage between attempts, without spending restarts.

An attempt that failed because checkpoint storage could not be reached (its restore met
:class:`~epochstream.exceptions.StorageUnavailableError`) would fail again at once:
restoring needs the storage. Nor should it use up the restart strategy: an outage is
not the job's fault, and a user with ``fixed_delay(attempts=3, delay=1)`` must not lose
the job to a 20 s outage. So the :class:`~epochstream.deploy.failures.FailureHandler`
hands such a failure to a :class:`StorageWaiter`, which probes the storage with
exponential back-off (no deadline: the job keeps trying, and says so through the
:class:`~epochstream.checkpoint.outage.StorageOutage`) until it answers; then the next
attempt restores the same checkpoint, never an older one.

Example::

    waiter = StorageWaiter(outage, probe=lambda: storage.probe(latest_id),
                           sleep=inbox.sleep, wall=time.time)
    waiter.wait(failure.error)   # returns once storage answers; JobCancelled from sleep
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from epochstream.checkpoint.outage import StorageOutage
from epochstream.core.storage_faults import Backoff, is_unavailable

__all__ = ["OUTAGE_BACKOFF", "StorageWaiter"]

log = logging.getLogger(__name__)

#: Probes at 0.5, 1, 2, 4, 8, 10, 10... s: quick to notice a short outage, cheap in a long one.
OUTAGE_BACKOFF = Backoff(initial=0.5, multiplier=2.0, max_delay=10.0, deadline=None)


class StorageWaiter:
    """Probes checkpoint storage with back-off until it answers (see module doc).

    ``probe`` raises what reading the storage raises now (``None``: no storage to probe,
    one back-off delay is waited instead); ``sleep`` serves the job master's events
    while it waits (a cancel ends the wait); ``wall`` is the wall clock.
    """

    def __init__(
        self,
        outage: StorageOutage,
        *,
        probe: Callable[[], None] | None,
        sleep: Callable[[float], None],
        wall: Callable[[], float],
        backoff: Backoff = OUTAGE_BACKOFF,
    ) -> None:
        self._outage = outage
        self._probe = probe
        self._sleep = sleep
        self._wall = wall
        self._backoff = backoff
        self._waits = 0  # consecutive waits with no successful restore in between

    def wait(self, error: BaseException | None, cause: str) -> None:
        """An attempt failed with storage unavailable (``error``, ``cause``): return once
        storage answers again. Probes that fail with anything but an outage end the wait
        too (the next attempt meets that error and the restart strategy judges it)."""
        self._outage.failed(str(error) if error is not None else cause, now=self._wall())
        delays = self._backoff.delays()
        if self._probe is None:
            # Nothing to probe: wait longer after each consecutive failed restore.
            delay = next(delays)
            for _ in range(self._waits):
                delay = next(delays)
            self._waits += 1
            self._sleep(delay)
            return
        for delay in delays:
            self._sleep(delay)
            try:
                self._probe()
            except Exception as err:  # classified: only an outage keeps us waiting
                if not is_unavailable(err):
                    log.warning("storage probe failed (not an outage): %r", err)
                    return
                self._outage.failed(str(err), now=self._wall())
                continue
            log.warning("checkpoint storage answers again: restarting from the same checkpoint")
            return

    def restored(self) -> None:
        """An attempt is running: the next wait starts its back-off afresh.

        The outage is not ended here: slots report running once their peers are
        connected, before their tasks read their state, so storage may still be down
        (ending it here logged "available again" and served ``AVAILABLE`` in the middle
        of an outage). It ends when a checkpoint completes, which proves every task
        restored and storage took the writes (the coordinator reports that)."""
        self._waits = 0
