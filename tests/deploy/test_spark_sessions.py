"""Jobs of different parallelism in one process, each with the default Spark runner."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import epochstream as es
    for p in (2, 3, 1):
        env = es.Environment(parallelism=p)
        (env.from_sequence(0, 1000).map(lambda i: (i % 5, 1)).key_by(lambda t: t[0]).sum(1)
            .sink_to(es.sinks.DiscardSink()))
        result = env.execute(f"p{p}")
        print("ok", p, result.restarts, flush=True)
""")


@pytest.mark.slow
@pytest.mark.spark
def test_session_grows_for_a_job_with_more_slots(tmp_path) -> None:
    script = tmp_path / "jobs.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [line for line in proc.stdout.splitlines() if line.startswith("ok")] == [
        "ok 2 0",
        "ok 3 0",
        "ok 1 0",
    ]
