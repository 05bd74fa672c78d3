"""``epochstream checkpoints`` and ``inspect``: look at checkpoints and savepoints on storage.

``checkpoints DIR`` lists every completed checkpoint and savepoint under DIR (a storage
root, a job directory, a ``chk-<n>`` or savepoint directory) and reports unreadable
ones instead of failing. ``inspect DIR`` describes one snapshot (the newest under DIR
when it holds several): operators, their states and kinds, key-group coverage, sizes,
and every referenced file that is missing.

Both refuse a local DIR that other local users could change (its ``_metadata`` holds
pickles, and reading it runs them) unless given ``--trust-shared-storage``.

Example::

    epochstream checkpoints s3://bucket/ckpt
    epochstream inspect /data/sp/savepoint-3f2a9c-1b2c3d4e5f60
"""

from __future__ import annotations

import argparse
from typing import Any

from epochstream.checkpoint.metadata import CheckpointMetadata
from epochstream.checkpoint.storage import CheckpointEntry, scan_checkpoints
from epochstream.cli.common import fail, human_size, utc
from epochstream.core.filesystems import storage_fs
from epochstream.exceptions import EpochstreamError
from epochstream.state.handles import KeyedStateHandle

__all__ = ["add_snapshot_commands", "describe", "missing_files"]


def add_snapshot_commands(sub: Any) -> None:
    """Register ``checkpoints`` and ``inspect`` on the subcommand parser ``sub``."""
    ck = sub.add_parser(
        "checkpoints",
        help="list completed checkpoints and savepoints under DIR",
        description="List the completed checkpoints and savepoints under DIR (a storage root, "
        "a job directory, one chk-<n> or savepoint); unreadable ones are reported, not fatal.",
    )
    ck.add_argument("dir", metavar="DIR")
    add_trust_flag(ck)
    ck.set_defaults(handler=_cmd_checkpoints)
    ins = sub.add_parser(
        "inspect",
        help="operators, states, key-group coverage and sizes of a checkpoint or savepoint",
        description="Describe the checkpoint or savepoint at DIR (the newest one when DIR holds "
        "several); missing files and unreadable metadata are reported.",
    )
    ins.add_argument("dir", metavar="DIR")
    add_trust_flag(ins)
    ins.set_defaults(handler=_cmd_inspect)


def add_trust_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--trust-shared-storage`` (read checkpoints other local users could change).

    Example: ``add_trust_flag(sub.add_parser("inspect"))``
    """
    parser.add_argument(
        "--trust-shared-storage",
        action="store_true",
        help="read checkpoints and savepoints even where other local users could change "
        "them (they hold pickles: those users could run code as you)",
    )


def _scan(command: str, ns: argparse.Namespace) -> list[CheckpointEntry] | int:
    try:
        return scan_checkpoints(ns.dir, trust_shared=ns.trust_shared_storage)
    except EpochstreamError as exc:
        return fail(command, str(exc))


def _cmd_checkpoints(ns: argparse.Namespace) -> int:
    entries = _scan("checkpoints", ns)
    if isinstance(entries, int):
        return entries
    if not entries:
        print(f"no completed checkpoints under {ns.dir}")
        return 1
    print(
        f"{'job':<34} {'id':>6}  {'kind':<10} {'completed (UTC)':<20} {'size':>10} {'duration':>9}  path"
    )
    unreadable = 0
    for entry in entries:
        md = entry.metadata
        if md is None:
            unreadable += 1
            reason = (entry.error or "").splitlines()[0]
            print(
                f"{entry.job:<34} {entry.checkpoint_id:>6}  UNREADABLE {entry.directory}: {reason}"
            )
            continue
        # A checkpoint whose files are gone (a corrupt one a job discarded but could not
        # delete, e.g. an earlier run's that --resume fell back from) is not complete:
        # say so here as `inspect` does, not list it as restorable.
        missing = missing_files(md)
        if missing:
            unreadable += 1
            print(
                f"{md.job_id:<34} {md.checkpoint_id:>6}  INCOMPLETE {entry.directory}: "
                f"{len(missing)} referenced files missing, e.g. {missing[0]}"
            )
            continue
        print(
            f"{md.job_id:<34} {md.checkpoint_id:>6}  {md.kind:<10} {utc(md.completion_time):<20} "
            f"{human_size(md.stats.state_size):>10} {md.stats.duration * 1000:>7.0f}ms  {entry.directory}"
        )
    return 1 if unreadable else 0


def _cmd_inspect(ns: argparse.Namespace) -> int:
    entries = _scan("inspect", ns)
    if isinstance(entries, int):
        return entries
    if not entries:
        return fail("inspect", f"no checkpoint or savepoint under {ns.dir}")
    newest = max(entries, key=lambda e: e.metadata.completion_time if e.metadata else -1.0)
    if len(entries) > 1:
        print(f"{len(entries)} snapshots under {ns.dir}; the newest:")
    if newest.metadata is None:
        print(f"UNREADABLE {newest.directory}: {newest.error}")
        return 1
    lines, problems = describe(newest.directory, newest.metadata)
    print("\n".join(lines))
    return 1 if problems else 0


def _coverage(ranges: list[range], max_parallelism: int) -> str:
    covered = sorted({kg for r in ranges for kg in r})
    if covered == list(range(max_parallelism)):
        return f"0..{max_parallelism - 1} complete"
    missing = sorted(set(range(max_parallelism)) - set(covered))
    shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
    return f"{len(covered)} of {max_parallelism} (missing {shown})"


def _keyed_handles(subtasks: dict[int, Any]) -> dict[int, KeyedStateHandle]:
    return {i: s.keyed for i, s in sorted(subtasks.items()) if s.keyed is not None}


def _missing(files: list[str]) -> list[str]:
    return [f for f in files if not storage_fs(f).exists(f)]


def missing_files(md: CheckpointMetadata) -> list[str]:
    """Every file ``md`` references that is not on storage (``checkpoints`` and
    ``inspect`` agree on what is missing)."""
    return [
        f
        for uid in sorted(md.operators)
        for handle in _keyed_handles(md.operators[uid]).values()
        for f in _missing(handle.files())
    ]


def describe(directory: str, md: CheckpointMetadata) -> tuple[list[str], int]:
    """Text lines describing a snapshot, and the number of problems found (missing files)."""
    lines = [
        f"{md.kind} {md.checkpoint_id} of job {md.job_id}"
        + (f" ({md.job_name!r})" if md.job_name else "")
        + f" at {directory}",
        f"  completed {utc(md.completion_time)} UTC, parallelism {md.parallelism}, "
        f"max parallelism {md.max_parallelism}, {human_size(md.stats.state_size)}",
    ]
    problems = 0
    for uid in sorted(md.operators):
        subtasks = md.operators[uid]
        lines.append(
            f"  operator {uid} ({md.operator_parallelism.get(uid, md.parallelism)} subtasks)"
        )
        handles = _keyed_handles(subtasks)
        if handles:
            first = next(iter(handles.values()))
            states = getattr(first, "states", {})
            kinds = ", ".join(f"{n} ({k})" for n, k in sorted(states.items())) or "-"
            lines.append(f"    keyed state: {first.TYPE} format; states: {kinds}")
            ranges = [h.key_groups for h in handles.values()]
            lines.append(f"    key groups: {_coverage(ranges, md.max_parallelism)}")
            for index, handle in handles.items():
                files = handle.files()
                missing = _missing(files)
                problems += len(missing)
                r = handle.key_groups
                lines.append(
                    f"    subtask {index}: key groups {r.start}..{r.stop - 1}, {len(files)} files, "
                    f"{human_size(handle.size)}"
                )
                lines.extend(f"      MISSING {f}" for f in missing)
        lists: dict[str, int] = {}
        for s in subtasks.values():
            for name, values in {**s.operator_lists, **s.union_lists}.items():
                lists[name] = lists.get(name, 0) + len(values)
        if lists:
            text = ", ".join(f"{name} ({n} entries)" for name, n in sorted(lists.items()))
            lines.append(f"    operator state: {text}")
    lines.append(
        "  all referenced files present" if not problems else f"  {problems} files MISSING"
    )
    return lines, problems
