"""PyFlink peer: workloads A and B as a DataStream job with Python functions.

Runs inside the PyFlink virtualenv (``/tmp/bench-venvs/pyflink``), started by
``bench/run.py`` as ``python pyflink_job.py B --n 10000000 --checkpoint 1.0``. The
map/key/reduce functions are Python, so records cross from the JVM to Python
worker processes (Beam's fn-execution harness) and back, as in any PyFlink job with
Python UDFs. Prints one JSON line with the result.

Example::

    /tmp/bench-venvs/pyflink/bin/python bench/peers/pyflink_job.py B --n 1000000
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from workloads import B_KEYS, peer_arguments


def _key0(t: tuple[object, int]) -> object:
    return t[0]


def _sum(a: tuple[object, int], b: tuple[object, int]) -> tuple[object, int]:
    return (a[0], a[1] + b[1])


def _b_record(i: int) -> tuple[int, int]:
    return (i * 7919 % B_KEYS, i % 1000)


def _word_pair(w: str) -> tuple[str, int]:
    return (w.lower(), 1)


def main() -> None:
    parser = peer_arguments("pyflink_job peer")
    parser.add_argument("--checkpoint", type=float, default=0.0)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--mode", choices=["process", "thread"], default="process")
    args = parser.parse_args()

    from pyflink.common import Configuration, Types, WatermarkStrategy
    from pyflink.datastream import StreamExecutionEnvironment
    from pyflink.datastream.connectors.base import Sink
    from pyflink.java_gateway import get_gateway

    ckdir = tempfile.mkdtemp(prefix="pyflink-ck-")
    conf = Configuration()
    conf.set_string("python.execution-mode", args.mode)
    # Workers must run this venv's interpreter (the one with pyflink), not `python` on PATH.
    conf.set_string("python.executable", sys.executable)
    conf.set_string("python.client.executable", sys.executable)
    # A failure must end the run with an error rather than restart forever.
    conf.set_string("restart-strategy.type", "none")
    conf.set_string("execution.checkpointing.dir", f"file://{ckdir}")
    conf.set_string("state.backend.type", "hashmap")
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.set_parallelism(args.parallelism)
    if args.checkpoint > 0:
        env.enable_checkpointing(int(args.checkpoint * 1000))
    pair = Types.TUPLE([Types.LONG(), Types.LONG()])
    if args.workload == "B":
        from pyflink.datastream.connectors.number_seq import NumberSequenceSource

        src = env.from_source(
            NumberSequenceSource(0, args.n - 1), WatermarkStrategy.no_watermarks(), "seq"
        )
        stream = (
            src.map(_b_record, output_type=pair).key_by(_key0, key_type=Types.LONG()).reduce(_sum)
        )
        events = args.n
    else:
        from pyflink.datastream.connectors.file_system import FileSource, StreamFormat

        pair = Types.TUPLE([Types.STRING(), Types.LONG()])
        source = FileSource.for_record_stream_format(
            StreamFormat.text_line_format(), args.path
        ).build()
        stream = (
            env.from_source(source, WatermarkStrategy.no_watermarks(), "text")
            .flat_map(str.split, output_type=Types.STRING())
            .map(_word_pair, output_type=pair)
            .key_by(_key0, key_type=Types.STRING())
            .reduce(_sum)
        )
        events = args.n
    discard = get_gateway().jvm.org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink()
    stream.sink_to(Sink(discard))
    start = time.perf_counter()
    result = env.execute(f"pyflink-{args.workload}")
    wall = time.perf_counter() - start
    net = result.get_net_runtime() / 1000.0
    print(
        json.dumps(
            {
                "events": events,
                "seconds": wall,
                "net_seconds": net,
                "checkpoint_dir": ckdir,
                "mode": args.mode,
            }
        )
    )


if __name__ == "__main__":
    main()
