"""The epochstream demo: exactly-once word count on Spark, with a real crash.

It counts the words of a text the project ships (repeated to make the run last a
few seconds) on Spark local mode at parallelism 2, with a checkpoint every 0.5 s
and a two-phase-commit FileSink. After the first checkpoint completes it kills the
Python process of one slot with SIGKILL. The job master notices, cancels the Spark
job, restores every task from the latest completed checkpoint and rewinds the file
source. At the end the demo checks that the committed output holds exactly the
failure-free counts, with no update written twice.

Run it with ``make demo`` (or ``python examples/wordcount_demo.py [OUT_DIR]``).
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import signal
import sys
import threading
import time

import epochstream as es
from epochstream.deploy.spark import create_session

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT = os.path.join(HERE, "data", "streams.txt")
COPIES = 1500


def prepare(out_dir: str) -> tuple[str, collections.Counter[str]]:
    """Write the input (the shipped text COPIES times) and its failure-free word count."""
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    with open(TEXT, encoding="utf-8") as f:
        text = f.read()
    path = os.path.join(out_dir, "input.txt")
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(COPIES):
            f.write(text)
    expected = collections.Counter(w.lower() for w in text.split())
    return path, collections.Counter({w: n * COPIES for w, n in expected.items()})


def watch(client: es.JobClient, stop: threading.Event) -> None:
    """Print checkpoints as they complete; crash slot 1 after the first one."""
    printed = 0
    killed = False
    attempt = 1
    while not stop.is_set():
        stats = client.checkpoint_stats()
        for s in stats[printed:]:
            align = max((t.alignment_s for t in s.tasks.values()), default=0.0)
            print(
                f"  checkpoint {s.checkpoint_id:>3} complete: {s.state_size / 1024:7.1f} KiB, "
                f"{s.duration * 1000:6.0f} ms, max alignment {align * 1000:5.1f} ms",
                flush=True,
            )
        printed = len(stats)
        if client.attempt > attempt:
            attempt = client.attempt
            print(
                f"  -> attempt {attempt} deployed; restoring checkpoint "
                f"{stats[-1].checkpoint_id if stats else '(none)'} and rewinding the source",
                flush=True,
            )
        # Kill after the first checkpoint, while input is still being read (the final
        # checkpoint of a bounded job comes only once every source is exhausted).
        if not killed and printed >= 1 and not client.done:
            pid = client.slot_pids()[1]
            print(f"  !! killing slot 1 (Python worker pid {pid}) with SIGKILL", flush=True)
            os.kill(pid, signal.SIGKILL)
            killed = True
        time.sleep(0.02)


def main() -> int:
    out_dir = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "demo-out")
    logging.basicConfig(level=logging.ERROR)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    path, expected = prepare(out_dir)
    print(
        f"epochstream demo: word count of {sum(expected.values()):,} words, parallelism 2, "
        "Spark local[2], checkpoint every 0.5 s, FileSink (two-phase commit)"
    )

    # The JVM logs the killed worker's stack trace at ERROR; the demo prints its own account.
    spark = create_session("local[2]")
    spark.sparkContext.setLogLevel("OFF")
    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.5, storage=os.path.join(out_dir, "checkpoints"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=1.0))
    (
        env.from_text_file(path)
        .flat_map(str.split)
        .map(lambda w: (w.lower(), 1))
        .key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]))
        .sink_to(es.sinks.FileSink(os.path.join(out_dir, "counts"), format="jsonl"))
    )

    client = env.execute_async("wordcount-demo")
    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(client, stop), daemon=True)
    watcher.start()
    result = client.result()
    stop.set()
    watcher.join()

    print(
        f"job {result.job_id} finished: {result.restarts} restart(s), "
        f"{len(result.checkpoints)} checkpoints, {result.duration:.1f} s"
    )
    for i, failure in enumerate(result.failures, 1):
        print(f"  failure {i}: {failure.splitlines()[0]}")

    rows = es.testing.read_committed(os.path.join(out_dir, "counts"))
    updates = collections.Counter((w, n) for w, n in rows)
    duplicates = [u for u, c in updates.items() if c > 1]
    final: dict[str, int] = {}
    for w, n in rows:
        final[w] = max(final.get(w, 0), n)
    complete = all(updates[(w, k)] == 1 for w, n in expected.items() for k in range(1, n + 1))
    ok = final == dict(expected) and not duplicates and complete
    if result.restarts < 1:
        print("note: the job finished before the crash took effect; nothing was recovered")
        ok = False
    print(
        f"committed updates: {len(rows):,} (expected {sum(expected.values()):,}), "
        f"duplicates: {len(duplicates)}, distinct words: {len(final)}"
    )
    print(
        "RESULT:",
        "exactly-once OK: committed counts equal the failure-free count"
        if ok
        else "MISMATCH: committed output differs from the failure-free count",
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
