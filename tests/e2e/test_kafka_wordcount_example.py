"""``examples/kafka_wordcount.py`` run as a user runs it (a subprocess on Spark) against
the suite's Tansu broker: every committed update of the output topic occurs exactly
once and the final counts equal a count over the lines written to the input topic
(bounded; and unbounded, stopped by Ctrl-C with a savepoint and continued from it); a
missing topic stops it at once with a message naming the topic.

Committed output is read by control markers (``kafka_server.read_committed_json``):
Tansu's read_committed fetches also return records of aborted transactions.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_support import exactly_once_problems, write_corpus

from kafka_server import unique_topic

pytest.importorskip("confluent_kafka")
pytest.importorskip("kafka")

pytestmark = [pytest.mark.slow]

EXAMPLE = Path(__file__).parents[2] / "examples" / "kafka_wordcount.py"


def _env(tmp_path: Path) -> dict[str, str]:
    return dict(
        os.environ,
        SPARK_LOCAL_IP="127.0.0.1",
        XDG_STATE_HOME=str(tmp_path / "state"),
        XDG_CACHE_HOME=str(tmp_path / "cache"),
    )


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=_env(tmp_path),
    )


def _run_until_counted(
    tmp_path: Path, kafka_server: Any, topic: str, expected: collections.Counter[str], *args: str
) -> str:
    """Run the example unbounded, press Ctrl-C (SIGINT to its process group, as a
    terminal does) once ``topic`` holds the ``expected`` final counts; its stdout."""
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLE), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=_env(tmp_path),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            finals: dict[str, int] = {}
            for r in kafka_server.read_committed_json(topic, 2):
                finals[r["word"]] = max(finals.get(r["word"], 0), r["count"])
            if finals == dict(expected):
                break
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, f"final counts not reached: {finals}"
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert proc.returncode == 0, (out + err)[-3000:]
    return out


@pytest.mark.spark
def test_bounded_run_counts_every_word_exactly_once(tmp_path: Path, kafka_server: Any) -> None:
    lines_topic = kafka_server.new_topic("lines", partitions=2)
    counts_topic = kafka_server.new_topic("counts", partitions=2)
    group = unique_topic("wordcount")
    expected = write_corpus(tmp_path / "lines.txt", lines=3_000, seed=11)
    lines = (tmp_path / "lines.txt").read_text(encoding="utf-8").splitlines()
    kafka_server.produce(lines_topic, [(i % 2, line.encode()) for i, line in enumerate(lines)])

    done = _run(
        tmp_path,
        "--bootstrap-servers",
        kafka_server.bootstrap,
        "--input-topic",
        lines_topic,
        "--output-topic",
        counts_topic,
        "--group-id",
        group,
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--bounded",
    )

    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "finished" in done.stdout, done.stdout
    records = kafka_server.read_committed_json(counts_topic, 2)
    assert all(set(r) == {"word", "count"} for r in records), records[:5]
    rows = [[r["word"], r["count"]] for r in records]
    assert exactly_once_problems(rows, expected) == []
    assert kafka_server.read_open(counts_topic, 2) == []
    # The final checkpoint's offsets went to the group: all lines read, nothing past them.
    assert kafka_server.committed_offsets(group, lines_topic, 2) == [
        (len(lines) + 1) // 2,
        len(lines) // 2,
    ]
    assert any((tmp_path / "ckpt").iterdir()), "no checkpoints in --checkpoint-dir"


@pytest.mark.spark
def test_ctrl_c_stops_with_a_savepoint_and_a_new_run_continues_from_it(
    tmp_path: Path, kafka_server: Any
) -> None:
    lines_topic = kafka_server.new_topic("lines", partitions=2)
    counts_topic = kafka_server.new_topic("counts", partitions=2)
    expected = write_corpus(tmp_path / "first.txt", lines=500, seed=3)
    more = write_corpus(tmp_path / "more.txt", lines=500, seed=4)
    args = [
        "--bootstrap-servers",
        kafka_server.bootstrap,
        "--input-topic",
        lines_topic,
        "--output-topic",
        counts_topic,
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
    ]

    def produce(name: str) -> None:
        lines = (tmp_path / name).read_text(encoding="utf-8").splitlines()
        kafka_server.produce(lines_topic, [(i % 2, line.encode()) for i, line in enumerate(lines)])

    produce("first.txt")
    out = _run_until_counted(tmp_path, kafka_server, counts_topic, expected, *args)
    found = re.search(r"continue with --from-savepoint (\S+)", out)
    assert found, out
    produce("more.txt")
    expected += more
    _run_until_counted(
        tmp_path, kafka_server, counts_topic, expected, *args, "--from-savepoint", found[1]
    )

    rows = [[r["word"], r["count"]] for r in kafka_server.read_committed_json(counts_topic, 2)]
    assert exactly_once_problems(rows, expected) == []
    assert kafka_server.read_open(counts_topic, 2) == []


def test_a_missing_topic_stops_it_at_once_naming_the_topic(
    tmp_path: Path, kafka_server: Any
) -> None:
    lines_topic = kafka_server.new_topic("lines", partitions=1)
    missing = unique_topic("never-created")

    done = _run(
        tmp_path,
        "--bootstrap-servers",
        kafka_server.bootstrap,
        "--input-topic",
        lines_topic,
        "--output-topic",
        missing,
        "--runner",
        "local",
    )

    assert done.returncode == 2, (done.stdout + done.stderr)[-3000:]
    assert f"topic(s) {missing} do not exist on {kafka_server.bootstrap}" in done.stderr
