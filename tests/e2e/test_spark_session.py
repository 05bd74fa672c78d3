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
