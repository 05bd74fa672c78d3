"""A SparkSession created elsewhere, whose workers would start another interpreter."""

from __future__ import annotations

from typing import Any

import pytest

import epochstream as es


@pytest.mark.slow
@pytest.mark.spark
def test_local_session_with_foreign_python_exec_still_runs(spark: Any, tmp_path) -> None:
    sc = spark.sparkContext
    saved = sc.pythonExec
    sc.pythonExec = "/nonexistent/python3"  # what a session built without PYSPARK_PYTHON may hold
    try:
        env = es.Environment(parallelism=2, spark=spark)
        (
            env.from_sequence(0, 1000)
            .map(lambda i: (i % 4, i))
            .key_by(lambda t: t[0])
            .reduce(lambda a, b: (a[0], a[1] + b[1]))
            .sink_to(es.sinks.FileSink(str(tmp_path)))
        )
        env.execute("foreign-python")
        assert sc.pythonExec == "/nonexistent/python3", "the user's setting must be restored"
    finally:
        sc.pythonExec = saved
    final: dict[int, int] = {}
    for k, v in es.testing.read_committed(tmp_path):
        final[k] = max(final.get(k, 0), v)
    assert final == {k: sum(range(k, 1000, 4)) for k in range(4)}


@pytest.mark.spark
def test_tasks_fork_from_the_daemon_that_imported_epochstream(spark: Any) -> None:
    """create_session's workers come from ``epochstream.deploy.daemon``: a slot does not
    import epochstream, NumPy and pyarrow again in every job and attempt."""

    def parent_command(_: Any) -> Any:
        import os

        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            yield f.read().split(b"\0")

    commands = spark.sparkContext.parallelize(range(2), 2).mapPartitions(parent_command).collect()
    assert len(commands) == 2
    for command in commands:
        assert b"epochstream.deploy.daemon" in command, command
    assert (
        spark.sparkContext.getConf().get("spark.python.daemon.module")
        == "epochstream.deploy.daemon"
    )
