"""``epochstream check-upgrade``: would JOB.py start from that savepoint? (a dry run)

``epochstream check-upgrade job.py --from-savepoint SP [--allow-non-restored-state]
[-p N] [--json]`` runs the script up to its ``execute()``, which builds the job graph
and does not start it (the script stops there), and compares the job with the
savepoint through the restore's own code (:mod:`epochstream.deploy.upgrade_check`):
per operator uid restored / new / left behind, per state its verdict, max parallelism
and parallelism, sources whose positions are taken over, sinks with pending
transactions. It prints a table, or with ``--json`` one JSON object (keys in
docs/operations/cli.md).

Exit codes: 0 the restore would succeed; 1 it would fail; 2 bad usage (no such script,
an unreadable savepoint, a script that fails or never calls ``execute()``).

The script's own arguments follow it; check-upgrade's options go before the script or
after its arguments.

Example::

    epochstream check-upgrade job.py --from-savepoint /sp/savepoint-3f2a9c-1b2c -p 4
"""

from __future__ import annotations

import argparse
import json
import runpy
from typing import Any

from epochstream.api.environment import set_default_launcher, set_overrides
from epochstream.cli.common import fail, positive_int, prepare_script
from epochstream.cli.snapshots import add_trust_flag
from epochstream.deploy.client import DriverLauncher
from epochstream.deploy.upgrade_check import (
    OperatorCheck,
    StateCheck,
    UpgradeReport,
    check_upgrade,
    load_savepoint,
)
from epochstream.exceptions import EpochstreamError
from epochstream.graph.launch import JobDescription, JobHandle

__all__ = ["add_check_upgrade_command", "render_table"]

_COMMAND = "check-upgrade"


def add_check_upgrade_command(sub: Any) -> None:
    """Register ``check-upgrade`` on the subcommand parser ``sub``."""
    cmd = sub.add_parser(
        _COMMAND,
        help="dry run: would JOB.py start from a savepoint? (state by state)",
        description="Build JOB.py's job without running it and compare it with a savepoint: "
        "each operator uid restored / new / left behind, each state restored, migrated or "
        "refused, max parallelism, source positions and pending sink transactions. "
        "Exit 0 when the restore would succeed, 1 when it would fail, 2 on bad usage.",
        epilog="examples:\n"
        "  epochstream check-upgrade job.py --from-savepoint /sp/savepoint-3f2a9c-1b2c\n"
        "  epochstream check-upgrade job.py in.txt --from-savepoint /sp/sp-1 -p 8 --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument(
        "--from-savepoint",
        "-s",
        required=True,
        metavar="PATH",
        help="the savepoint (or a completed checkpoint: chk-<n>, _metadata, a dir of them)",
    )
    cmd.add_argument(
        "--allow-non-restored-state",
        action="store_true",
        help="state of operators the job no longer has would be dropped, not refused",
    )
    cmd.add_argument(
        "--parallelism", "-p", type=positive_int, metavar="N", help="the parallelism to check"
    )
    cmd.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    add_trust_flag(cmd)
    cmd.add_argument("script", metavar="JOB.py", help="the job script")
    cmd.add_argument("args", nargs="*", help="arguments passed to the script")
    cmd.set_defaults(handler=_cmd_check_upgrade)


class _Checked(BaseException):
    """Ends the script at its ``execute()`` once the job is checked. A BaseException,
    as SystemExit is, so a script's ``except Exception`` does not run the job on."""


class _CheckingLauncher:
    """The launcher ``execute()`` gets during a check: checks the described job while
    the script is still ``__main__`` (its classes are compared with the saved values'),
    then stops the script."""

    def __init__(self, savepoint: str) -> None:
        self.savepoint = savepoint
        self.report: UpgradeReport | None = None
        self.usage_error: str | None = None

    def launch(self, description: JobDescription) -> JobHandle:
        try:
            point = load_savepoint(self.savepoint, description)
            self.report = check_upgrade(description, point)
        except EpochstreamError as err:  # unreadable metadata or state files: not a verdict
            self.usage_error = f"cannot read savepoint {self.savepoint}: {err}"
            raise _Checked from err
        raise _Checked


def _cmd_check_upgrade(ns: argparse.Namespace) -> int:
    launcher = _CheckingLauncher(ns.from_savepoint)
    set_overrides(
        parallelism=ns.parallelism,
        restore_from=ns.from_savepoint,
        allow_non_restored_state=ns.allow_non_restored_state or None,
        trust_shared_storage=ns.trust_shared_storage or None,
    )
    set_default_launcher(launcher)
    try:
        problem = prepare_script(ns.script, ns.args)
        if problem is not None:
            return fail(_COMMAND, problem)
        runpy.run_path(ns.script, run_name="__main__")
    except _Checked:
        pass  # the job was described and checked: the script is not run further
    except Exception as err:  # the script's own failure, before its execute()
        return fail(_COMMAND, f"{ns.script} failed before execute(): {type(err).__name__}: {err}")
    finally:
        set_default_launcher(DriverLauncher())
        set_overrides(
            parallelism=None,
            restore_from=None,
            allow_non_restored_state=None,
            trust_shared_storage=None,
        )
    if launcher.usage_error is not None:
        return fail(_COMMAND, launcher.usage_error)
    if launcher.report is None:
        return fail(_COMMAND, f"{ns.script} ended without calling execute(): no job to check")
    report = launcher.report
    if ns.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(render_table(report))
    return 0 if report.ok else 1


# ---------------------------------------------------------------- the table


def render_table(report: UpgradeReport) -> str:
    """The report as plain text: a header, one row per operator state, job-level
    findings and the result.

    Example: ``print(render_table(report))``
    """
    lines = [
        f"savepoint: {report.savepoint} ({report.snapshot_kind} {report.checkpoint_id} of "
        f"job {report.saved_job_name!r})",
        "max parallelism: "
        f"savepoint {report.saved_max_parallelism}, job "
        f"{report.job_max_parallelism if report.job_max_parallelism is not None else 'not set'}"
        f" -> {report.max_parallelism}; parallelism {report.parallelism}",
        "allow non-restored state: " + ("yes" if report.allow_non_restored_state else "no"),
        "",
    ]
    rows: list[tuple[str, ...]] = [
        ("OPERATOR", "STATUS", "STATE", "SAVED", "NEW", "VERDICT", "NOTES")
    ]
    for op in report.operators:
        rows.extend(_operator_rows(op))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    for uid, splits in sorted(report.sources.items()):
        lines.append(f"source {uid}: takes over {splits} split position(s) from the savepoint")
    for uid, pending in sorted(report.sinks.items()):
        if pending:
            lines.append(f"sink {uid}: {pending} pending transaction(s), committed at restore")
    problems = list(report.errors)
    for op in report.operators:
        if op.error:
            problems.append(f"operator {op.uid!r}: open() failed: {op.error}")
        problems += [s.error for s in op.states if s.verdict == "fail"]
    if problems:
        lines += ["", "errors:"] + [f"  {p}" for p in problems]
    lines += ["", "result: the restore would " + ("succeed" if report.ok else "FAIL")]
    return "\n".join(lines)


def _operator_rows(op: OperatorCheck) -> list[tuple[str, ...]]:
    notes = []
    if op.renamed_to:
        notes.append(f"same states as new uid {op.renamed_to!r}: renamed?")
    if op.renamed_from:
        notes.append(f"same states as left-behind uid {op.renamed_from!r}: renamed?")
    if op.error:
        notes.append("open() failed")
    status = op.status.replace("_", " ")
    if not op.states:
        return [(op.uid, status, "-", "", "", "", "; ".join(notes))]
    rows: list[tuple[str, ...]] = []
    for i, state in enumerate(op.states):
        first = i == 0
        rows.append(
            (
                op.uid if first else "",
                status if first else "",
                state.name,
                _kind(state.saved_kind, state.saved_version),
                _kind(state.kind, state.version),
                state.verdict,
                "; ".join((notes if first else []) + _state_notes(state)),
            )
        )
    return rows


def _kind(kind: str | None, version: int | None) -> str:
    if kind is None:
        return "-"
    return kind if version is None else f"{kind} v{version}"


def _state_notes(state: StateCheck) -> list[str]:
    notes = []
    if state.serializer_changed:
        notes.append("serializer changed (values rewritten)")
    if state.ttl_changed:
        notes.append("TTL switched " + ("on" if state.ttl else "off"))
    if state.verdict == "undeclared":
        notes.append("not declared in open(); checked when first used")
    if state.verdict == "unchecked":
        notes.append("columnar SQL state: not checked")
    if state.verdict == "new":
        notes.append("starts empty")
    if state.verdict == "dropped":
        notes.append("not restored: no keyed operator with this uid")
    return notes
