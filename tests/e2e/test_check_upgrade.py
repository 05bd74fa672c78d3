"""``epochstream check-upgrade`` against the restore it predicts: one savepoint of
``jobs/upgrade_job.py v1``, then for each change of a matrix (new operator, removed
operator, renamed uid, changed descriptor kind, changed serializer and TTL, a
dataclass gaining a field, a version bump with and without ``migrate=``, max
parallelism exceeded or changed) the check's verdict, and the job really started from
the savepoint with ``epochstream run``: exit 0 exactly when the check said the restore
succeeds, and when it fails, with the error the check reported."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

JOB = Path(__file__).parent / "jobs" / "upgrade_job.py"

pytestmark = pytest.mark.slow


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "epochstream.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.fixture(scope="module")
def savepoint(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("upgrade")
    first = _cli(
        root, "run", "--runner", "local", "-q", str(JOB), "v1", str(root / "out"), str(root / "sp")
    )
    assert first.returncode == 0, first.stderr[-3000:]
    return first.stdout.strip().splitlines()[-1]


@dataclass(frozen=True)
class Case:
    mode: str
    ok: bool
    #: (operator uid, state name) -> the verdict the check must give.
    verdicts: dict[tuple[str, str], str] = field(default_factory=dict)
    #: Words the reported error (and so the restore's) must contain.
    reason: str = ""
    options: tuple[str, ...] = ()
    #: uid -> operator status the check must give.
    statuses: dict[str, str] = field(default_factory=dict)


CASES = [
    Case("same", True, {("profiles", "profile"): "restore", ("profiles", "total"): "restore"}),
    Case(
        "new-operator",
        True,
        {("extra", "seen"): "new", ("profiles", "profile"): "restore"},
        statuses={"extra": "new", "profiles": "restored"},
    ),
    Case(
        "removed-operator",
        False,
        {("profiles", "profile"): "dropped"},
        reason="state of operators ['profiles'] has no operator with that uid",
        statuses={"profiles": "left_behind"},
    ),
    Case(
        "removed-operator",
        True,
        {("profiles", "profile"): "dropped"},
        options=("--allow-non-restored-state",),
    ),
    Case(
        "renamed-uid",
        False,
        {("profiles-v2", "profile"): "new", ("profiles", "profile"): "dropped"},
        reason="state of operators ['profiles'] has no operator with that uid",
        statuses={"profiles-v2": "new", "profiles": "left_behind"},
    ),
    Case(
        "kind-changed",
        False,
        {("profiles", "profile"): "fail", ("profiles", "total"): "restore"},
        reason="it was saved as value state and is now list state",
    ),
    Case("serializer-ttl", True, {("profiles", "total"): "restore"}),
    Case(
        "field-added",
        False,
        {("profiles", "profile"): "fail"},
        reason="__main__:Profile: field 'email' added",
    ),
    Case("migrated", True, {("profiles", "profile"): "migrate"}),
    Case(
        "version-no-migrate",
        False,
        {("profiles", "profile"): "fail"},
        reason="version 2 without migrate=",
    ),
    Case(
        "same",
        False,
        reason="parallelism 200 is above the state's max_parallelism 128",
        options=("-p", "200"),
    ),
    Case(
        "max-parallelism",
        False,
        reason="its max_parallelism is 128 but the job sets 64",
    ),
]


def _errors(report: dict[str, Any]) -> list[str]:
    found = list(report["errors"])
    for op in report["operators"]:
        found += [s["error"] for s in op["states"] if s["error"]]
        if op["error"]:
            found.append(op["error"])
    return found


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.mode}{''.join(c.options)}")
def test_the_check_predicts_the_restore(savepoint: str, tmp_path: Path, case: Case) -> None:
    out = str(tmp_path / "out")
    check = _cli(
        tmp_path,
        "check-upgrade",
        str(JOB),
        case.mode,
        out,
        "--from-savepoint",
        savepoint,
        "--json",
        *case.options,
    )
    assert check.returncode in (0, 1), check.stderr[-3000:]
    assert not (tmp_path / "out").exists(), "the check built the job and did not run it"
    report = json.loads(check.stdout)
    assert report["ok"] is case.ok and check.returncode == (0 if case.ok else 1)
    operators = {op["uid"]: op for op in report["operators"]}
    for (uid, name), verdict in case.verdicts.items():
        states = {s["name"]: s for s in operators[uid]["states"]}
        assert states[name]["verdict"] == verdict, operators[uid]
    for uid, status in case.statuses.items():
        assert operators[uid]["status"] == status
    errors = _errors(report)
    assert bool(errors) is not case.ok
    if case.reason:
        assert any(case.reason in e for e in errors), errors

    restore = _cli(
        tmp_path,
        "run",
        "--runner",
        "local",
        "-q",
        "--from-savepoint",
        savepoint,
        *case.options,
        str(JOB),
        case.mode,
        out,
    )
    assert (restore.returncode == 0) is case.ok, restore.stderr[-3000:]
    if not case.ok:
        # The restore stops at its first refusal: one the check reported, word for word.
        assert any(e in restore.stderr for e in errors), (errors, restore.stderr[-3000:])


def test_the_report_names_what_else_the_restore_does(savepoint: str, tmp_path: Path) -> None:
    """Serializer and TTL changes, source positions, pending sink transactions, the
    renamed-uid hint, and the readable table."""
    check = _cli(
        tmp_path, "check-upgrade", str(JOB), "serializer-ttl", "o", "-s", savepoint, "--json"
    )
    report = json.loads(check.stdout)
    profiles = {op["uid"]: op for op in report["operators"]}["profiles"]
    total = {s["name"]: s for s in profiles["states"]}["total"]
    assert total["serializer_changed"] is True and total["ttl_changed"] is True
    assert (total["saved_ttl"], total["ttl"]) == (False, True)
    profile = {s["name"]: s for s in profiles["states"]}["profile"]
    assert profile["serializer_changed"] is False and profile["ttl_changed"] is False
    assert report["sources"] == [{"uid": "numbers", "splits": 2}]
    assert [s["uid"] for s in report["sinks"]] == ["files"]
    assert report["max_parallelism"] == {"savepoint": 128, "job": None, "used": 128}

    renamed = _cli(tmp_path, "check-upgrade", str(JOB), "renamed-uid", "o", "-s", savepoint)
    assert renamed.returncode == 1
    assert "same states as new uid 'profiles-v2': renamed?" in renamed.stdout
    assert "result: the restore would FAIL" in renamed.stdout
