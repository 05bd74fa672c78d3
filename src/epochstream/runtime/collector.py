"""Cyclic garbage collector settings while a slot runs.

The row path allocates a tuple or more per record, and most of them are still alive
when a young collection runs (records of the batches in flight, the values a keyed
operator just stored), so with CPython's default thresholds, a young collection every
700 allocations, the collector examines nearly every record: about 12 % of workload
B's instructions per event (``bench/rowpath_hotpath.py --instructions``: 7,660 with
the defaults, 6,758 with the collector off). Collecting the young generation every
100,000 allocations examines fewer of them (7,429, -3 %); in the slots of a
3 M-event run of workload B the collector's CPU went from 0.19-0.20 s to 0.03 s per
slot (about 7 % of the job's CPU), collecting the same cyclic garbage. The older
generations keep CPython's ratios. Reference counting frees everything else at once,
as always.

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
SLOT_GC_THRESHOLDS = (100_000, 10, 10)


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
