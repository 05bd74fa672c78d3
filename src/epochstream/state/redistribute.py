"""Assigning a checkpoint's state to the subtasks of a (re)started job, at any parallelism.

Keyed state follows key groups: new subtask ``i`` gets every keyed file's segments for
the key groups in its new range. Operator list state is split round-robin over the
concatenation of the old subtasks' lists (Flink's default); union list state is merged
and given whole to every subtask.

Example::

    restores = build_restores(
        {0: state0, 1: state1},
        old_parallelism=2, new_parallelism=3, max_parallelism=128, owned=False,
    )
    restores[2].keyed   # handles restricted to key groups 86..127
"""

from __future__ import annotations

from typing import Any

from epochstream.exceptions import ConfigurationError, StateError
from epochstream.state.handles import KeyedStateHandle, OperatorRestore, OperatorSubtaskState
from epochstream.state.keygroups import key_group_range_for_operator, validate_parallelism

__all__ = ["build_restores", "merge_union_lists", "redistribute_operator_lists"]


def redistribute_operator_lists(
    old: list[dict[str, list[Any]]], new_parallelism: int
) -> list[dict[str, list[Any]]]:
    """Split old subtasks' list states over ``new_parallelism`` subtasks.

    At unchanged parallelism each subtask keeps its own lists. Otherwise, per state
    name, element ``j`` of the concatenation (in old-subtask order) goes to subtask
    ``j % new_parallelism``. Names with no elements for a subtask are left out.

    Example::

        redistribute_operator_lists([{"s": [1, 2]}, {"s": [3]}], 2) == [{"s": [1, 2]}, {"s": [3]}]
        redistribute_operator_lists([{"s": [1, 2]}, {"s": [3]}], 3) == [
            {"s": [1]}, {"s": [2]}, {"s": [3]}
        ]
    """
    if not isinstance(new_parallelism, int) or new_parallelism < 1:
        raise ConfigurationError(f"new parallelism must be >= 1, got {new_parallelism!r}")
    if len(old) == new_parallelism:
        return [{name: list(values) for name, values in lists.items() if values} for lists in old]
    result: list[dict[str, list[Any]]] = [{} for _ in range(new_parallelism)]
    for name, concatenated in merge_union_lists(old).items():
        for subtask in range(min(new_parallelism, len(concatenated))):
            result[subtask][name] = concatenated[subtask::new_parallelism]
    return result


def merge_union_lists(old: list[dict[str, list[Any]]]) -> dict[str, list[Any]]:
    """Concatenate each name's lists in old-subtask order (what every subtask restores).

    Example::

        merge_union_lists([{"u": [1]}, {"u": [2], "v": [3]}]) == {"u": [1, 2], "v": [3]}
    """
    merged: dict[str, list[Any]] = {}
    for lists in old:
        for name, values in lists.items():
            if values:
                merged.setdefault(name, []).extend(values)
    return merged


def _keyed_handles(
    states: dict[int, OperatorSubtaskState], max_parallelism: int
) -> list[KeyedStateHandle]:
    handles: list[KeyedStateHandle] = []
    for index in sorted(states):
        handle = states[index].keyed
        if handle is None:
            continue
        if handle.key_groups.stop > max_parallelism:
            raise StateError(
                f"keyed state of old subtask {index} covers key groups {handle.key_groups.start}"
                f"..{handle.key_groups.stop - 1}, beyond max_parallelism {max_parallelism}; "
                "max_parallelism cannot change once a job has state"
            )
        handles.append(handle)
    return handles


def build_restores(
    states: dict[int, OperatorSubtaskState],
    *,
    old_parallelism: int,
    new_parallelism: int,
    max_parallelism: int,
    owned: bool = False,
) -> list[OperatorRestore]:
    """One :class:`OperatorRestore` per new subtask of one operator.

    ``states`` maps old subtask index to its snapshot; missing indices mean empty.
    Keyed handles are restricted to each new subtask's key-group range (handles with
    no overlap are dropped). ``owned``: the state is this job's own checkpoint.

    Example::

        restores = build_restores({0: s0}, old_parallelism=1, new_parallelism=2,
                                  max_parallelism=128)
        len(restores) == 2
    """
    validate_parallelism(old_parallelism, max_parallelism)
    validate_parallelism(new_parallelism, max_parallelism)
    unknown = sorted(i for i in states if not 0 <= i < old_parallelism)
    if unknown:
        raise StateError(
            f"state for subtask {unknown[0]} does not exist at old parallelism {old_parallelism}"
        )
    empty = OperatorSubtaskState()
    old = [states.get(i, empty) for i in range(old_parallelism)]
    lists = redistribute_operator_lists([s.operator_lists for s in old], new_parallelism)
    unions = merge_union_lists([s.union_lists for s in old])
    handles = _keyed_handles(states, max_parallelism)
    restores: list[OperatorRestore] = []
    for index in range(new_parallelism):
        mine = key_group_range_for_operator(max_parallelism, new_parallelism, index)
        keyed = [r for r in (h.restricted_to(mine) for h in handles) if r is not None]
        restores.append(
            OperatorRestore(
                keyed=keyed,
                operator_lists=lists[index],
                union_lists={name: list(values) for name, values in unions.items()},
                owned=owned,
            )
        )
    return restores
