"""A job whose Spark JVM dies mid-run, for ``test_spark_lost.py``.

``python spark_lost_driver.py OUT CKPT MARKER REPORT``: counts per key over a throttled
sequence on Spark local[2] with checkpoints. The first run (MARKER absent) kills the
driver's Spark JVM after two checkpoints and writes what ``execute`` raised to REPORT;
the run resumed with the command from that message finds MARKER and runs to the end.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

import epochstream as es

N = 40_000


def pair(i: int) -> tuple[int, int]:
    return (i % 5, 1)


def first(t: tuple[int, int]) -> int:
    return t[0]


def add(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return (a[0], a[1] + b[1])


def main() -> None:
    out, ckpt, marker, report = sys.argv[1:5]
    env = es.Environment(parallelism=2)
    env.enable_checkpointing(0.5, storage=ckpt)
    (
        env.from_sequence(0, N, rate=4_000)
        .uid("numbers")
        .map(pair)
        .key_by(first)
        .reduce(add)
        .uid("counts")
        .sink_to(es.sinks.FileSink(out))
        .uid("out")
    )
    client = env.execute_async("spark-lost")
    if not os.path.exists(marker):

        def kill_jvm() -> None:
            client.wait_for_checkpoint(2)
            from pyspark import SparkContext

            open(marker, "w").close()
            os.kill(SparkContext._gateway.proc.pid, signal.SIGKILL)

        threading.Thread(target=kill_jvm, daemon=True).start()
    try:
        result = client.result(timeout=180)
    except es.JobExecutionError as err:
        with open(report, "w") as f:
            json.dump({"error": str(err), "restarts": err.restarts}, f)
        sys.exit(3)
    with open(report, "w") as f:
        json.dump({"restarts": result.restarts, "restored_from": result.restored_from}, f)


if __name__ == "__main__":
    main()
