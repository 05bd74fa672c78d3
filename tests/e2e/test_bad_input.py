"""A text file with a line that is not UTF-8: fail fast naming file and offset, or dead-letter it.

Bad data is not fixed by restarting, so the job must fail at once (no restart loop) with
an error naming the file and the byte offset; with a dead-letter sink the bad line goes
there (with its file and offset) and every good line is processed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import epochstream as es

GOOD_LINES = 6_000
BAD_AT = 4_000  # past the middle: the bad line lies in the second byte-range split
BAD_LINE = b"bad \xff\xfe line"


def _write_input(path: Path) -> tuple[list[str], int]:
    """Write good lines with BAD_LINE in between; return the good lines and BAD_LINE's offset."""
    good = [f"line {i} of the input with some padding text" for i in range(GOOD_LINES)]
    data = bytearray()
    bad_offset = -1
    for i, line in enumerate(good):
        if i == BAD_AT:
            bad_offset = len(data)
            data += BAD_LINE + b"\n"
        data += line.encode("utf-8") + b"\n"
    path.write_bytes(bytes(data))
    # Large enough that parallelism 2 splits the file, so offsets must be file-absolute.
    assert len(data) > 2 * es.sources.TextFileSource.MIN_SPLIT_BYTES
    return good, bad_offset


def _error_chain(err: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = err
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


@pytest.mark.slow
def test_undecodable_line_fails_the_job_naming_file_and_offset(tmp_path: Path) -> None:
    text = tmp_path / "input.txt"
    _, line_offset = _write_input(text)
    bad_byte = line_offset + BAD_LINE.index(b"\xff")
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.2, storage=str(tmp_path / "ckpt"))
    # Plenty of restarts allowed: a data error must still not be retried.
    env.set_restart_strategy(es.restart.fixed_delay(attempts=50, delay=0.1))
    env.from_text_file(str(text)).sink_to(es.sinks.FileSink(str(tmp_path / "out")))

    with pytest.raises(es.JobExecutionError) as info:
        env.execute("bad-utf8")

    err = info.value
    assert err.restarts == 0, f"a decode error was retried: {err.history}"
    assert len(err.history) == 1
    assert str(text) in err.cause
    assert f"byte offset {bad_byte}" in err.cause, err.cause
    decode_errors = [e for e in _error_chain(err) if isinstance(e, es.SourceDecodeError)]
    for decode_error in decode_errors:  # when the chain carries the error, it must agree
        assert os.path.samefile(decode_error.path, text)
        assert decode_error.offset == bad_byte


@pytest.mark.slow
def test_undecodable_line_goes_to_the_dead_letter_sink(tmp_path: Path) -> None:
    text, out, dlq = tmp_path / "input.txt", tmp_path / "out", tmp_path / "dlq"
    good, line_offset = _write_input(text)
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.2, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=1, delay=0.1))
    (
        env.from_text_file(str(text), dead_letter=es.sinks.FileSink(str(dlq))).sink_to(
            es.sinks.FileSink(str(out))
        )
    )

    result = env.execute("bad-utf8-dead-letter")

    assert result.restarts == 0
    rows: list[Any] = es.testing.read_committed(out)
    assert sorted(rows) == sorted(good)
    dead: list[Any] = es.testing.read_committed(dlq)
    assert len(dead) == 1, dead
    record = dead[0]
    assert os.path.samefile(record["file"], text)
    assert record["offset"] == line_offset
    assert record["line"] == BAD_LINE.decode("utf-8", errors="backslashreplace")
    assert record["error"], "the dead-letter record does not say why the line failed"
