"""Cyclic garbage collector settings while a slot runs.

CPython's defaults, ``(700, 10, 10)``, collect the young generation every 700 net
allocations of tracked objects, the middle one every 10 young collections and the
whole heap every 10 middle ones (while the objects added since the last full
collection exceed a quarter of the old generation). A keyed job's state is tracked
objects that grow with it (windows' lists and dicts, a join's buffered rows), so that
last condition keeps being met: Nexmark q5 on rows ran 26 full collections per slot in
a 1 M-event job, 140 ms each, 3.7 s of a 12 s job (2026-11-26). Full collections every
100 middle ones instead of 10 bring that to 0-1 per job; the young generation every
2,000 allocations leaves fewer records of the batches in flight for it to examine
(about 1,000 collections of 0.4 ms instead of 3,200 of 0.14 ms). q5 went from 78-94 k to
142-151 k events/s; the largest pauses are a middle collection's 6-7 ms and, rarely, a
full one. Young generations of 100,000 (tried on 2026-11-23) were faster still but made
every young collection a 50-100 ms pause: the row path's p99 latency.

Example::

    with slot_collector():
        run_the_slot()
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["SLOT_GC_THRESHOLDS", "slot_collector"]

#: ``gc.set_threshold`` while a slot runs: (young, middle, old).
SLOT_GC_THRESHOLDS = (2_000, 10, 100)


@contextmanager
def slot_collector() -> Iterator[None]:
    """Run the block with :data:`SLOT_GC_THRESHOLDS`, then restore the process's own
    (a Spark Python worker outlives the slot it ran)."""
    previous = gc.get_threshold()
    gc.set_threshold(*SLOT_GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*previous)
