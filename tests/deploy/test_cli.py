"""`epochstream run` applies settings to the script's Environments; `checkpoints` lists them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

JOB = textwrap.dedent("""
    import json, sys
    import epochstream as es
    out, report = sys.argv[1], sys.argv[2]
    env = es.Environment(parallelism=1, runner="spark")
    env.enable_checkpointing(0.1, storage="/nonexistent/overridden")
    (env.from_sequence(0, 20000, rate=40000).map(lambda i: (i % 3, i))
        .key_by(lambda t: t[0]).reduce(lambda a, b: (a[0], a[1] + b[1]))
        .sink_to(es.sinks.FileSink(out)))
    r = env.execute("cli")
    json.dump({"parallelism": env.parallelism, "runner": env.runner,
               "checkpoints": len(r.checkpoints), "job_id": r.job_id}, open(report, "w"))
""")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "epochstream.cli", *args],
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.slow
def test_run_applies_overrides_and_checkpoints_lists(tmp_path) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    ckpt = tmp_path / "ckpt"
    report = tmp_path / "report.json"
    proc = _cli(
        "run",
        "--parallelism",
        "2",
        "--runner",
        "local",
        "--checkpoint-dir",
        str(ckpt),
        str(script),
        str(tmp_path / "out"),
        str(report),
    )
    assert proc.returncode == 0, proc.stderr
    info = json.loads(report.read_text())
    assert (info["parallelism"], info["runner"]) == (2, "local")
    assert info["checkpoints"] >= 1
    assert os.path.isdir(ckpt / info["job_id"])
    listing = _cli("checkpoints", str(ckpt))
    assert listing.returncode == 0, listing.stderr
    assert info["job_id"] in listing.stdout and "chk-" in listing.stdout


def test_checkpoints_on_empty_dir_and_bad_script(tmp_path) -> None:
    proc = _cli("checkpoints", str(tmp_path))
    assert proc.returncode == 1 and "no completed checkpoints" in proc.stdout
    proc = _cli("run", str(tmp_path / "missing.py"))
    assert proc.returncode == 2 and "no such job script" in proc.stderr


@pytest.mark.slow
def test_run_restore_from_resumes_at_another_parallelism(tmp_path) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    first = _cli(
        "run",
        "-p",
        "2",
        "--runner",
        "local",
        "--checkpoint-dir",
        str(ckpt),
        str(script),
        str(out),
        str(tmp_path / "r1.json"),
    )
    assert first.returncode == 0, first.stderr
    job_id = json.loads((tmp_path / "r1.json").read_text())["job_id"]
    rows_before = sorted(map(tuple, _committed(out)))
    # The first job finished: resuming its final checkpoint at p=3 has nothing left to read.
    second = _cli(
        "run",
        "-p",
        "3",
        "--runner",
        "local",
        "--checkpoint-dir",
        str(ckpt),
        "--restore-from",
        str(ckpt / job_id),
        str(script),
        str(out),
        str(tmp_path / "r2.json"),
    )
    assert second.returncode == 0, second.stderr
    assert json.loads((tmp_path / "r2.json").read_text())["parallelism"] == 3
    assert sorted(map(tuple, _committed(out))) == rows_before


def _committed(path) -> list:
    import epochstream as es

    return es.testing.read_committed(path)


def test_cli_errors_are_one_line_with_exit_code_2(tmp_path) -> None:
    proc = _cli("checkpoints", "/nonexistent")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "epochstream checkpoints: /nonexistent: no such checkpoint directory"
    ]
    proc = _cli("run", "--log-level", "LOUD", str(tmp_path / "job.py"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "unknown log level 'LOUD'" in proc.stderr


def test_checkpoints_reports_corrupt_metadata(tmp_path) -> None:
    from epochstream.checkpoint.metadata import CheckpointMetadata
    from epochstream.checkpoint.storage import CheckpointStorage
    from epochstream.core.checkpoint_stats import CheckpointStats

    storage = CheckpointStorage(str(tmp_path), "job-a")
    for n in (1, 2):
        storage.write_metadata(
            n,
            CheckpointMetadata(
                job_id="job-a",
                checkpoint_id=n,
                trigger_time=1.0,
                completion_time=2.0,
                parallelism=1,
                max_parallelism=128,
                operators={},
                operator_parallelism={},
                stats=CheckpointStats(
                    checkpoint_id=n, trigger_time=1.0, duration=0.1, state_size=0
                ),
            ),
        )
    (tmp_path / "job-a" / "chk-1" / "_metadata").write_bytes(b"\xff\xfe not json")
    proc = _cli("checkpoints", str(tmp_path))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = proc.stdout.splitlines()
    assert any("UNREADABLE" in line and "chk-1" in line for line in lines)
    assert any(" 2  checkpoint" in line for line in lines)


def test_help_has_examples_and_version() -> None:
    proc = _cli("--help")
    assert proc.returncode == 0 and "examples:" in proc.stdout and "::" not in proc.stdout
    proc = _cli("--version")
    import epochstream

    assert proc.returncode == 0 and proc.stdout.strip() == f"epochstream {epochstream.__version__}"


def test_checkpoints_does_not_list_as_complete_what_inspect_finds_files_missing_in(
    tmp_path,
) -> None:
    """E.g. an earlier run's newest checkpoint that ``--resume`` found corrupt and fell
    back from: it is not the job's to delete, so it stays, and must not look restorable."""
    import epochstream as es

    env = es.Environment(parallelism=1, runner="local")
    env.enable_checkpointing(0.2, storage=str(tmp_path / "ck"), retained=2)
    (
        env.from_sequence(0, 3_000, rate=6_000)
        .uid("n")
        .key_by(lambda i: i % 3)
        .reduce(lambda a, b: a + b)
        .uid("sum")
        .sink_to(es.sinks.FileSink(str(tmp_path / "out")))
        .uid("s")
    )
    job_id = env.execute("lister").job_id
    job_dir = tmp_path / "ck" / job_id
    newest = max(job_dir.glob("chk-*"), key=lambda p: int(p.name[4:]))
    victims = sorted((job_dir / "shared").glob(f"{newest.name[4:]}-*"))
    assert victims, "the newest checkpoint wrote keyed state files"
    victims[0].unlink()
    listing = _cli("checkpoints", str(tmp_path / "ck"))
    inspect = _cli("inspect", str(newest))
    assert inspect.returncode == 1 and "MISSING" in inspect.stdout
    assert listing.returncode == 1
    line = next(
        x
        for x in listing.stdout.splitlines()
        if x.rstrip().endswith(newest.name) or f"{newest}:" in x
    )
    assert "INCOMPLETE" in line and str(victims[0]) in line
