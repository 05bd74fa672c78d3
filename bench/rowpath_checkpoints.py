"""W1's row job with its checkpoints itemised: per checkpoint and reduce subtask, the
alignment, the synchronous part and the asynchronous part (wall seconds, as the tasks
report them), and the job's CPU.

The job is ``bench/epochstream_jobs.py``'s keyed running sum on the local runner (its
slot processes are this process's children, so their CPU is counted:
``RUSAGE_SELF + RUSAGE_CHILDREN``), parallelism 2, checkpoints every ``--interval``
seconds or off. For profiles, run it under ``py-spy record --subprocesses --threads
--gil`` (only threads holding the GIL are sampled, so a thread's share of the samples
is its share of the interpreter).

Example::

    .venv/bin/python bench/rowpath_checkpoints.py --events 4000000
    .venv/bin/python bench/rowpath_checkpoints.py --events 4000000 --interval off
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def main(argv: list[str] | None = None) -> int:
    import epochstream_jobs as jobs

    import epochstream as es

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=4_000_000)
    parser.add_argument("--interval", default="1.0", help="seconds, or 'off'")
    args = parser.parse_args(argv)
    interval = None if args.interval == "off" else float(args.interval)
    env = jobs._environment(2, "local", None)
    jobs._enable(env, interval, "/tmp/epochstream-bench/ck-rowpath")
    (
        env.from_sequence(0, args.events)
        .uid("numbers")
        .map(lambda i: (i * 7919 % jobs.B_KEYS, i % 1000))
        .key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]))
        .uid("sums")
        .sink_to(es.sinks.DiscardSink())
    )
    start = time.perf_counter()
    result = env.execute("bench-rowpath-checkpoints")
    wall = time.perf_counter() - start
    cpu = sum(
        r.ru_utime + r.ru_stime
        for r in (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN),
        )
    )
    print(
        f"{args.events:,} events, checkpoints {args.interval}: {args.events / wall:,.0f} events/s, "
        f"CPU {cpu:.2f} s ({cpu / args.events * 1e6:.3f} s per million events)"
    )
    print("checkpoint: reduce subtask (alignment, sync, async) ms, wall")
    for ck in result.checkpoints:
        parts = {
            task: tuple(round(x * 1e3, 1) for x in (t.alignment_s, t.sync_s, t.async_s))
            for task, t in sorted(ck.tasks.items())
            if task.startswith("sums")
        }
        print(ck.checkpoint_id, parts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
