"""Workload C (windowed word count) on epochstream and Spark Structured Streaming, and
the watermark propagation delay of epochstream at half load.

Throughput: workload A's text with an event timestamp before each line (see
``bench/peers/workloads.py``), words counted per word and 5 s tumbling window of event
time, watermark 2 s behind the largest timestamp; epochstream on Spark ``local[2]``
at parallelism 2 with checkpoints every 1 s and off, Spark Structured Streaming
(``withWatermark`` + ``groupBy(window, word).count()``, append mode, ``noop`` sink,
``Trigger.AvailableNow`` over the text split into files) in its own process, both
interleaved ``--repeat`` times. Rates are words per second.

Delay: a generator source emits words stamped with the wall clock at half the
median epochstream rate measured above (``--latency-rate`` to set it), watermarks
``monotonous_timestamps()`` (the watermark trails the newest event by 1 ms); words are
counted per 1 s tumbling window; a sink stamps each window result with the wall clock
when it arrives. The delay of a result is that time minus the window's end: the time
from the event that closed the window being appended to the result being out (the
theoretical minimum is 0). Measured with the default watermark interval (200 ms) and
with 50 ms.

Example::

    .venv/bin/python bench/windows_bench.py                 # about 4 minutes
    .venv/bin/python bench/windows_bench.py --quick         # smoke run
    .venv/bin/python bench/windows_bench.py --render bench/windows.json
"""

from __future__ import annotations

import os

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import argparse
import glob
import json
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import epochstream as es

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "peers"))

import cloudpickle  # noqa: E402
from epochstream_jobs import run_windowed_wordcount  # noqa: E402
from machine import machine_facts, machine_line  # noqa: E402
from workloads import (  # noqa: E402
    ensure_text,
    ensure_timestamped_text,
    split_text,
    text_stats,
    vocabulary,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])

DATA = "/tmp/epochstream-bench"


# ------------------------------------------------------------------ throughput


def _inputs(text_mb: float) -> tuple[str, str]:
    """Workload C's timestamped text of ``text_mb`` and the directory of its 32 parts."""
    text = ensure_text(os.path.join(DATA, f"words-{text_mb:g}mb.txt"), text_mb)
    timed = ensure_timestamped_text(text, os.path.join(DATA, f"words-ts-{text_mb:g}mb.txt"))
    parts = os.path.join(DATA, f"words-ts-{text_mb:g}mb-parts")
    split_text(timed, parts, 32)
    return timed, parts


def _spark_ss(parts: str, words: int, parallelism: int) -> dict[str, Any]:
    argv = [
        sys.executable,
        os.path.join(HERE, "peers", "spark_ss_job.py"),
        "C",
        "--n",
        str(words),
        "--path",
        parts,
        "--files-per-batch",
        "2",
        "--parallelism",
        str(parallelism),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    row["rate"] = words / row["seconds"]
    return row


def measure_throughput(args: argparse.Namespace, spark: Any) -> list[dict[str, Any]]:
    timed, parts = _inputs(args.text_mb)
    lines, tokens = text_stats(timed)
    words = tokens - lines  # each line's timestamp is not a word
    rows = {
        "1 s": {"system": "epochstream", "checkpoints": "1 s", "runs": []},
        "off": {"system": "epochstream", "checkpoints": "off", "runs": []},
        "spark-ss": {
            "system": "Spark Structured Streaming",
            "checkpoints": "micro-batch",
            "runs": [],
        },
    }
    for repeat in range(args.repeat):
        for label, checkpoint in (("1 s", 1.0), ("off", None)):
            row = run_windowed_wordcount(
                timed,
                words,
                spark=spark,
                parallelism=args.parallelism,
                checkpoint=checkpoint,
                storage=os.path.join(DATA, "ck-c"),
            )
            rows[label]["runs"].append(row)
            print(
                f"  run {repeat + 1}/{args.repeat}: epochstream {label}: {row['rate']:,.0f} words/s"
            )
        ss = _spark_ss(parts, words, args.parallelism)
        rows["spark-ss"]["runs"].append(ss)
        print(
            f"  run {repeat + 1}/{args.repeat}: spark-ss: {ss.get('rate', 0):,.0f} words/s {ss.get('error', '')}"
        )
    out = []
    for entry in rows.values():
        rates = [r["rate"] for r in entry["runs"] if "rate" in r]
        entry["words"] = words
        entry["rate"] = statistics.median(rates) if rates else None
        entry["rates"] = rates
        out.append(entry)
    return out


# ------------------------------------------------------------------ delay


class _Split:
    def __init__(self, split_id: str, emitted: int) -> None:
        self.split_id = split_id
        self.emitted = emitted


class StampedWords(es.sources.Source):
    """Words stamped with the wall clock when emitted, ``rate`` per second in total,
    for ``seconds``."""

    def __init__(self, rate: float, seconds: float, words: list[str]) -> None:
        self.rate = rate
        self.seconds = seconds
        self.words = words

    def create_splits(self, parallelism: int) -> list[Any]:
        return [_Split(f"stamped-{i}", 0) for i in range(parallelism)]

    def create_reader(self, ctx: Any) -> Any:
        return _StampedReader(self.rate / ctx.parallelism, self.seconds, self.words)


class _StampedReader(es.sources.SourceReader):
    def __init__(self, rate: float, seconds: float, words: list[str]) -> None:
        self.rate = rate
        self.seconds = seconds
        self.words = words
        self.splits: list[_Split] = []
        self.start: float | None = None

    def add_splits(self, splits: list[Any]) -> None:
        self.splits.extend(splits)

    def poll(self, max_records: int) -> list[Any]:
        now = time.time()
        if self.start is None:
            self.start = now
        out: list[Any] = []
        stamp = int(now * 1000)
        for split in self.splits:
            due = min(int((now - self.start) * self.rate), int(self.seconds * self.rate))
            take = min(due - split.emitted, max_records - len(out))
            words = self.words
            out += [(stamp, words[(split.emitted + k) % len(words)]) for k in range(max(take, 0))]
            split.emitted += max(take, 0)
        return out

    def next_available(self) -> float | None:
        return time.monotonic() + 0.001

    @property
    def exhausted(self) -> bool:
        return self.start is not None and all(
            s.emitted >= int(self.seconds * self.rate) for s in self.splits
        )

    def snapshot(self, checkpoint_id: int) -> list[Any]:
        return [_Split(s.split_id, s.emitted) for s in self.splits]

    def close(self) -> None:
        self.splits = []


class WindowEnd(es.ProcessWindowFunction):
    def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
        for _ in elements:
            out.collect(ctx.window.end)


class DelaySink(es.sinks.Sink):
    """Writes, per subtask, the delay (ms) of every window result it receives."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def create_writer(self, ctx: Any) -> Any:
        return _DelayWriter(os.path.join(self.directory, f"delays-{ctx.subtask_index}.json"))


class _DelayWriter(es.sinks.AtLeastOnceSinkWriter):
    def __init__(self, path: str) -> None:
        self.path = path
        self.delays: list[int] = []

    def write_batch(self, records: list[Any]) -> None:
        now = int(time.time() * 1000)
        self.delays += [now - end for end in records]

    def close(self) -> None:
        with open(self.path, "w", encoding="utf-8") as f:
            json.dump(self.delays, f)


def measure_delay(
    spark: Any, rate: float, seconds: float, interval_ms: int, parallelism: int
) -> dict[str, Any]:
    out = tempfile.mkdtemp(prefix="window-delay-")
    env = es.Environment(parallelism=parallelism, spark=spark)
    env.enable_checkpointing(1.0, storage=os.path.join(out, "ck"))
    env.set_auto_watermark_interval(interval_ms)
    strategy = es.WatermarkStrategy.monotonous_timestamps().with_timestamp_assigner(
        lambda r, ts: r[0]
    )
    (
        env.from_source(
            StampedWords(rate, seconds, vocabulary()[:2_000]), watermark_strategy=strategy
        )
        .key_by(lambda r: r[1])
        .window(es.TumblingEventTimeWindows.of(1_000))
        .aggregate(_Count(), WindowEnd())
        .sink_to(DelaySink(out))
    )
    start = time.perf_counter()
    env.execute("window-delay")
    wall = time.perf_counter() - start
    delays: list[int] = []
    for path in glob.glob(os.path.join(out, "delays-*.json")):
        with open(path, encoding="utf-8") as f:
            delays += json.load(f)
    # The last windows fire when the input ends, before their end in wall time: only
    # windows that time closed count.
    delays = sorted(d for d in delays if d >= 0)
    if not delays:
        return {"error": "no window results", "interval_ms": interval_ms}
    q = statistics.quantiles(delays, n=100)
    return {
        "interval_ms": interval_ms,
        "rate": rate,
        "seconds": seconds,
        "wall_s": wall,
        "results": len(delays),
        "p50_ms": q[49],
        "p90_ms": q[89],
        "p99_ms": q[98],
        "max_ms": delays[-1],
        "min_ms": delays[0],
    }


class _Count(es.AggregateFunction):
    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, accumulator: int) -> int:
        return accumulator + 1

    def get_result(self, accumulator: int) -> int:
        return accumulator

    def merge(self, a: int, b: int) -> int:
        return a + b


# ------------------------------------------------------------------ report


def render(doc: dict[str, Any]) -> str:
    out = [
        "| system | checkpoints | words | words/s (median) | runs, k words/s |",
        "|---|---|---:|---:|---|",
    ]
    for r in doc["throughput"]:
        rate = "failed" if r["rate"] is None else f"{r['rate']:,.0f}"
        runs = ", ".join(f"{x / 1000:,.0f}" for x in r["rates"])
        out.append(f"| {r['system']} | {r['checkpoints']} | {r['words']:,} | {rate} | {runs} |")
    out += [
        "",
        "| watermark interval | words/s | window results | p50 ms | p90 ms | p99 ms | max ms |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for d in doc["delay"]:
        if "error" in d:
            out.append(f"| {d['interval_ms']} | failed: {d['error']} | | | | | |")
            continue
        out.append(
            f"| {d['interval_ms']} | {d['rate']:,.0f} | {d['results']:,} | {d['p50_ms']:.0f} "
            f"| {d['p90_ms']:.0f} | {d['p99_ms']:.0f} | {d['max_ms']:.0f} |"
        )
    out += ["", machine_line(doc["machine"])]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="small text, one repeat, short delay runs"
    )
    parser.add_argument("--text-mb", type=float, default=16.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument(
        "--latency-rate", type=float, default=None, help="words/s for the delay runs"
    )
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    parser.add_argument("--out", default=os.path.join(HERE, "windows.json"))
    parser.add_argument("--render", metavar="RESULTS_JSON")
    args = parser.parse_args(argv)
    if args.render:
        with open(args.render, encoding="utf-8") as f:
            print(render(json.load(f)))
        return 0
    if args.quick:
        args.text_mb, args.repeat, args.latency_seconds = 2.0, 1, 5.0
    from epochstream.deploy.spark import create_session

    spark = create_session(f"local[{args.parallelism}]", app_name="windows-bench")
    try:
        doc: dict[str, Any] = {"machine": machine_facts(spark=True), "settings": vars(args)}
        warm, _ = _inputs(1.0)
        run_windowed_wordcount(
            warm, 1, spark=spark, parallelism=args.parallelism
        )  # session warm-up
        doc["throughput"] = measure_throughput(args, spark)
        ours = doc["throughput"][0]  # epochstream with checkpoints every 1 s
        rate = args.latency_rate or 0.5 * ours["rate"]
        doc["delay"] = [
            measure_delay(spark, rate, args.latency_seconds, interval, args.parallelism)
            for interval in (200, 50)
        ]
    finally:
        spark.stop()
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
    print(render(doc))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
