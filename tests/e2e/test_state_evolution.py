"""State schema evolution end to end: a dataclass value gains a field between two
versions of a job (``jobs/profile_job.py``), run by ``epochstream run``. With
``version=2`` and ``migrate=`` the saved profiles are migrated and the counts continue
exactly once; without, the restore fails at once naming the state and the field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import epochstream as es

JOB = Path(__file__).parent / "jobs" / "profile_job.py"
EVENTS, USERS = 20_000, 5

pytestmark = pytest.mark.slow


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "epochstream.cli", "run", "--runner", "local", "-q", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_a_dataclass_gaining_a_field_migrates_or_fails_naming_the_field(tmp_path: Path) -> None:
    first = _run(tmp_path, str(JOB), "v1", str(tmp_path / "out1"), str(tmp_path / "sp"))
    assert first.returncode == 0, first.stderr[-3000:]
    savepoint = first.stdout.strip().splitlines()[-1]
    saved = es.savepoint.read(savepoint, "profiles", "profile")
    assert 0 < sum(p.visits for p in _values(saved)) < EVENTS  # stopped mid-stream

    refused = _run(
        tmp_path, "--from-savepoint", savepoint, str(JOB), "v2-unmigrated", str(tmp_path / "o")
    )
    assert refused.returncode != 0
    assert "state 'profile'" in refused.stderr and "field 'email' added" in refused.stderr
    assert "version=2 and migrate=" in refused.stderr
    assert not (tmp_path / "o").exists() or not es.testing.read_committed(str(tmp_path / "o"))

    second = _run(tmp_path, "--from-savepoint", savepoint, str(JOB), "v2", str(tmp_path / "out2"))
    assert second.returncode == 0, second.stderr[-3000:]
    rows = es.testing.read_committed(str(tmp_path / "out2"))
    assert {email for _name, _visits, email in rows} == {f"u{i}@example.com" for i in range(USERS)}
    final = {name: max(v for n, v, _e in rows if n == name) for name, _v, _e in rows}
    # The migrated profiles kept their visits: the counts continue exactly once.
    assert final == {f"u{i}": EVENTS // USERS for i in range(USERS)}
    assert len(rows) == EVENTS - sum(p.visits for p in _values(saved))


def _values(table: object) -> list[object]:
    # A dataclass value reads back as its repr (the savepoint reader's fallback) or as
    # itself; the counts are what the test compares.
    values = table.column("value").to_pylist()  # type: ignore[attr-defined]
    return [_Visits(v) for v in values]


class _Visits:
    def __init__(self, value: object) -> None:
        if isinstance(value, str):  # "Profile(name='u1', visits=12)"
            self.visits = int(value.split("visits=")[1].rstrip(")").split(",")[0])
        else:
            self.visits = int(getattr(value, "visits", value["visits"]))  # type: ignore[index]
