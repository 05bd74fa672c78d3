"""The peers' recovery measurement (bench/peer_recovery.py) against a real process.

The "peer" is a small script on this interpreter that writes a steady throughput to
the probe; the driver SIGKILLs its process group and starts it again. Also PyFlink's
choice of the checkpoint to resume from (no PyFlink needed).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path[:0] = [str(BENCH / "peers"), str(BENCH)]
try:
    import peer_recovery
    import pyflink_sql_job
finally:
    del sys.path[:2]

# A peer with a steady 20,000 records/s; a restarted one (attempt 1) first takes
# ``delay`` seconds to "restore", says so, then runs at the same rate.
FAKE_PEER = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, sys.argv[1])
    from rate_probe import RateProbe, write_restore
    probe_dir, attempt, delay, child = sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
    # A child in the same process group, like a peer's JVM: the kill must take it too.
    import subprocess
    sub = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    open(child, "w").write(str(sub.pid))
    if attempt:
        time.sleep(delay)
        write_restore(probe_dir, attempt, {"position": 42})
    probe = RateProbe(probe_dir, attempt=attempt)
    while True:
        probe.add(time.time(), 500)
        time.sleep(0.025)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (killed, not yet reaped by its parent, itself killed) counts as gone.
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def test_kill_and_restart_times_a_real_kill_and_restart(tmp_path: Path) -> None:
    script = tmp_path / "peer.py"
    script.write_text(FAKE_PEER)
    probe = tmp_path / "probe"
    children: list[Path] = []

    def start(attempt: int) -> subprocess.Popen[bytes]:
        child = tmp_path / f"child-{attempt}"
        children.append(child)
        argv = [str(BENCH / "peers"), str(probe), str(attempt), "1.5", str(child)]
        return subprocess.Popen(
            [sys.executable, str(script), *argv],
            start_new_session=True,
        )

    out = peer_recovery.kill_and_restart(
        start, str(probe), what="fake peer", kill_after=1.5, timeout=20.0
    )
    assert out["dipped"] is True
    assert out["restored"] == {"position": 42}
    # The restarted process waits 1.5 s before any output, after its own start.
    assert 1.5 <= out["resumed_s"] <= out["recovery_s"] < 20.0
    assert out["baseline_rate"] == pytest.approx(20_000, rel=0.3)
    # Both process groups are gone, children (the "JVMs") included.
    for child in children:
        assert not _alive(int(child.read_text()))


def test_killing_a_group_waits_for_a_child_its_exited_leader_left_behind(
    tmp_path: Path,
) -> None:
    # The leader starts a child in its group and exits by itself: the child (a peer's
    # JVM outliving its launcher) must still be killed and waited for.
    child_file = tmp_path / "child"
    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
            f"open({str(child_file)!r}, 'w').write(str(p.pid))",
        ],
        start_new_session=True,
    )
    leader.wait(timeout=30)
    child = int(child_file.read_text())
    assert peer_recovery._live_members(leader.pid) == [child]
    peer_recovery._kill_group(leader)
    assert peer_recovery._live_members(leader.pid) == []
    assert not _alive(child)


def test_a_peer_that_dies_before_the_kill_is_an_error_naming_it(tmp_path: Path) -> None:
    def start(attempt: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-c", "raise SystemExit(3)"], start_new_session=True
        )

    with pytest.raises(RuntimeError, match="crashing peer: exited 3 before the kill"):
        peer_recovery.kill_and_restart(start, str(tmp_path), what="crashing peer")


def test_pyflink_resumes_from_the_newest_completed_checkpoint(tmp_path: Path) -> None:
    assert pyflink_sql_job.latest_checkpoint(str(tmp_path)) is None
    for job, chk, complete, mtime in [
        ("a1", 3, True, 100),
        ("a1", 4, True, 200),
        ("a1", 5, False, 300),  # being written when the process died: no _metadata
        ("b2", 1, True, 150),
    ]:
        d = tmp_path / job / f"chk-{chk}"
        d.mkdir(parents=True)
        if complete:
            (d / "_metadata").write_bytes(b"x")
            os.utime(d / "_metadata", (mtime, mtime))
    assert pyflink_sql_job.latest_checkpoint(str(tmp_path)) == str(tmp_path / "a1" / "chk-4")
