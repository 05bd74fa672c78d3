"""``epochstream check-upgrade``'s command line: exit codes, the table and the JSON, on a
savepoint's metadata written by hand (the e2e matrix, tests/e2e/test_check_upgrade.py,
checks its verdicts against real restores)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from epochstream.checkpoint.metadata import CheckpointMetadata
from epochstream.checkpoint.storage import CheckpointStorage
from epochstream.cli import main
from epochstream.core.checkpoint_stats import CheckpointStats
from epochstream.runtime.operators.connectors import SPLITS
from epochstream.state.handles import HeapSnapshotHandle, OperatorSubtaskState

JOB = textwrap.dedent("""
    import sys
    import epochstream as es

    class Count(es.KeyedProcessFunction):
        def open(self, ctx):
            self.count = ctx.get_state(es.state.ValueStateDescriptor("count"))

        def process_element(self, value, ctx, out):
            out.collect(value)

    env = es.Environment(parallelism=2, runner="local")
    (env.from_sequence(0, 10).uid("src").key_by(lambda x: x % 2)
        .process(Count()).uid(sys.argv[1]).print())
    env.execute("j")
    raise AssertionError("check-upgrade stops the script at execute()")
""")


@pytest.fixture(autouse=True)
def _keep_interpreter_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command sets sys.argv and sys.path for the script, as ``run`` does."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))


def _savepoint(root: Path) -> str:
    md = CheckpointMetadata(
        job_id="old",
        job_name="j",
        checkpoint_id=3,
        trigger_time=1.0,
        completion_time=2.0,
        parallelism=2,
        max_parallelism=128,
        operators={
            "src": {0: OperatorSubtaskState(operator_lists={SPLITS: ["s0", "s1"]})},
            "counts": {
                0: OperatorSubtaskState(
                    keyed=HeapSnapshotHandle(key_groups=range(0, 64), states={"count": "value"})
                )
            },
        },
        operator_parallelism={"src": 2, "counts": 2},
        stats=CheckpointStats(checkpoint_id=3, trigger_time=1.0, duration=0.1, state_size=0),
    )
    storage = CheckpointStorage(str(root), "old")
    storage.write_metadata(3, md)
    return storage.checkpoint_path(3)


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "job.py"
    path.write_text(JOB)
    return str(path)


def test_a_restorable_job_exits_0_with_a_table(
    tmp_path: Path, script: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sp = _savepoint(tmp_path / "ck")
    assert main(["check-upgrade", script, "counts", "--from-savepoint", sp]) == 0
    out = capsys.readouterr().out
    assert "counts" in out and "value v1" in out and "restore" in out
    assert "source src: takes over 2 split position(s)" in out
    assert out.rstrip().endswith("result: the restore would succeed")


def test_a_refused_restore_exits_1_and_json_names_the_reason(
    tmp_path: Path, script: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sp = _savepoint(tmp_path / "ck")
    assert main(["check-upgrade", "-s", sp, "--json", script, "renamed"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    assert "state of operators ['counts'] has no operator with that uid" in report["errors"][0]
    ops = {op["uid"]: op for op in report["operators"]}
    assert ops["counts"]["renamed_to"] == "renamed"
    assert main(["check-upgrade", "-s", sp, "--allow-non-restored-state", script, "renamed"]) == 0


def test_usage_errors_exit_2(
    tmp_path: Path, script: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sp = _savepoint(tmp_path / "ck")
    assert main(["check-upgrade", str(tmp_path / "nope.py"), "-s", sp]) == 2
    assert "no such job script" in capsys.readouterr().err
    assert main(["check-upgrade", script, "counts", "-s", str(tmp_path / "nothing")]) == 2
    assert "cannot read savepoint" in capsys.readouterr().err
    idle = tmp_path / "idle.py"
    idle.write_text("import epochstream as es\nes.Environment(parallelism=1)\n")
    assert main(["check-upgrade", str(idle), "-s", sp]) == 2
    assert "ended without calling execute()" in capsys.readouterr().err
    broken = tmp_path / "broken.py"
    broken.write_text("raise ValueError('bad input path')\n")
    assert main(["check-upgrade", str(broken), "-s", sp]) == 2
    assert "failed before execute(): ValueError: bad input path" in capsys.readouterr().err
