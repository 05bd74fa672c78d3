"""Word count on a Spark cluster with a slot's process SIGKILLed after the first checkpoint.

Run as a subprocess by ``test_standalone_cluster.py`` (one SparkContext per process):
it writes a seeded corpus, starts the job on ``--master``, kills slot ``--kill-slot``'s
Python worker by PID once a checkpoint completed, waits for the recovered result and
checks the committed output. The last stdout line is ``E2E_SUMMARY <json>``.

Example::

    python tests/e2e/jobs/standalone_wordcount.py --master spark://127.0.0.1:7077 \\
        --workdir /tmp/wc
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
import e2e_support
from e2e_support import build_wordcount, exactly_once_problems, is_python_process, write_corpus

import epochstream as es

# On a cluster the executors cannot import this folder's helpers: ship them by value.
cloudpickle.register_pickle_by_value(e2e_support)

SUMMARY_PREFIX = "E2E_SUMMARY "


def run(
    master: str, workdir: Path, kill_slot: int, lines: int, lines_per_second: float
) -> dict[str, Any]:
    """Run the job, kill a slot mid-run, and describe what happened."""
    text, out = workdir / "words.txt", workdir / "out"
    expected = write_corpus(text, lines=lines, seed=77)
    total_updates = sum(expected.values())
    env = es.Environment(parallelism=2, spark_master=master)
    env.enable_checkpointing(0.3, storage=str(workdir / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.5))
    build_wordcount(env, text, out, lines_per_second=lines_per_second)

    started = time.monotonic()
    client = env.execute_async("standalone-wordcount")
    summary: dict[str, Any] = {"master": master, "expected_updates": total_updates}
    killed_at = started
    try:
        summary["checkpoint_before_kill"] = client.wait_for_checkpoint(1, timeout=180)
        summary["seconds_to_first_checkpoint"] = round(time.monotonic() - started, 2)
        pid = client.slot_pids()[kill_slot]
        summary["killed_pid"] = pid
        summary["killed_is_python"] = is_python_process(pid)
        summary["killed_is_driver"] = pid == os.getpid()
        summary["committed_before_kill"] = len(es.testing.read_committed(out))
        summary["done_before_kill"] = client.done
        if summary["killed_is_python"] and not summary["killed_is_driver"] and not client.done:
            os.kill(pid, signal.SIGKILL)
            summary["killed"] = True
            killed_at = time.monotonic()
        else:
            summary["killed"] = False
        result = client.result(timeout=300)
    finally:
        if not client.done:
            client.cancel()
    rows = es.testing.read_committed(out)
    summary.update(
        restarts=result.restarts,
        failures=[f.splitlines()[0] for f in result.failures],
        checkpoints=[c.checkpoint_id for c in result.checkpoints],
        pids_after=sorted(client.slot_pids().values()),
        committed_updates=len(rows),
        problems=exactly_once_problems(rows, expected),
        seconds=round(time.monotonic() - started, 2),
        seconds_after_kill=round(time.monotonic() - killed_at, 2),
    )
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", required=True)
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--kill-slot", type=int, default=0)
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--lines-per-second", type=float, default=3_000.0)
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    summary = run(args.master, args.workdir, args.kill_slot, args.lines, args.lines_per_second)
    sys.stdout.write(SUMMARY_PREFIX + json.dumps(summary) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
