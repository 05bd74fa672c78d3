"""The collector settings a slot runs with, and their restoration."""

from __future__ import annotations

import gc

import pytest

from epochstream.runtime.collector import SLOT_GC_THRESHOLDS, slot_collector


def test_slot_runs_with_its_thresholds_and_restores_the_process_ones() -> None:
    before = gc.get_threshold()
    with slot_collector():
        assert gc.get_threshold() == SLOT_GC_THRESHOLDS
        assert gc.isenabled(), "cyclic garbage is still collected"
    assert gc.get_threshold() == before


def test_thresholds_are_restored_when_the_slot_fails() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), slot_collector():
        raise RuntimeError("slot failed")
    assert gc.get_threshold() == before


def test_cyclic_garbage_is_still_freed_under_the_slot_thresholds() -> None:
    class Node:
        def __init__(self) -> None:
            self.me = self

    with slot_collector():
        gc.collect()
        for _ in range(3 * SLOT_GC_THRESHOLDS[0]):
            Node()
        alive = sum(isinstance(o, Node) for o in gc.get_objects(generation=0))
    assert alive < SLOT_GC_THRESHOLDS[0] + 1, "young collections ran and freed the cycles"
