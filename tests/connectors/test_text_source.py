from __future__ import annotations

import io
import itertools
import pickle
from pathlib import Path
from typing import Any

import pytest

from epochstream.connectors.base import SourceContext
from epochstream.connectors.files import TextFileReader, TextFileSplit
from epochstream.connectors.formats import TextFileSource
from epochstream.core.clock import ManualClock
from epochstream.exceptions import ConfigurationError, SourceDecodeError

CONTENTS: dict[str, bytes] = {
    "plain": b"alpha\nbeta\ngamma\n",
    "no_trailing_newline": b"alpha\nbeta\ngamma",
    "crlf": b"one\r\ntwo\r\n\r\nthree\r\n",
    "crlf_no_trailing": b"one\r\ntwo\r\nthree",
    "empty_lines": b"\n\n\na\n\n\nb\n\n",
    "only_newlines": b"\n\n\n\n",
    "single_line": b"single",
    "lone_cr": b"a\rb\nc\r\r\nd\r",
    "unicode": "héllo\nwörld\n€uro\n日本語のテキスト\nx\n".encode(),
    "long_lines": b"x" * 300 + b"\n" + b"y" * 5 + b"\n" + b"z" * 250,
}


def expected_lines(data: bytes, encoding: str = "utf-8") -> list[str]:
    """Reference split, written independently of the reader: strip "\\n" and one "\\r"."""
    if not data:
        return []
    parts = data.split(b"\n")
    terminated = [True] * (len(parts) - 1) + [False]
    if parts[-1] == b"":
        parts, terminated = parts[:-1], terminated[:-1]
    out = []
    for raw, term in zip(parts, terminated, strict=True):
        if term and raw.endswith(b"\r"):
            raw = raw[:-1]
        out.append(raw.decode(encoding))
    return out


def ctx(dead_letter: Any = None) -> SourceContext:
    return SourceContext(
        subtask_index=0, parallelism=1, clock=ManualClock(), dead_letter=dead_letter
    )


def drain(reader: TextFileReader, max_records: int = 1000) -> list[str]:
    out: list[str] = []
    for _ in range(100_000):
        if reader.exhausted:
            return out
        out.extend(reader.poll(max_records))
    raise AssertionError("reader never became exhausted")


def range_splits(path: Path, size: int, step: int) -> list[TextFileSplit]:
    bounds = [*range(0, size, step), size]
    return [TextFileSplit(f"{path}:{s}", str(path), s, e, s) for s, e in itertools.pairwise(bounds)]


@pytest.mark.parametrize("name", sorted(CONTENTS))
def test_every_split_size_covers_each_line_exactly_once(tmp_path: Path, name: str) -> None:
    data = CONTENTS[name]
    path = tmp_path / f"{name}.txt"
    path.write_bytes(data)
    want = expected_lines(data)
    for chunk_size in (1, 2, 7, 64, 1 << 20):
        source = TextFileSource(path, chunk_size=chunk_size)
        for step in range(1, len(data) + 1):
            got: list[str] = []
            # One reader per split, as if each split went to its own subtask.
            for split in range_splits(path, len(data), step):
                reader = source.create_reader(ctx())
                reader.add_splits([split])
                got.extend(drain(reader, max_records=3))
                reader.close()
            assert got == want, (name, chunk_size, step)


def test_one_reader_reads_many_splits_in_order(tmp_path: Path) -> None:
    data = b"".join(f"line {i}\r\n".encode() for i in range(500))
    path = tmp_path / "many.txt"
    path.write_bytes(data)
    reader = TextFileSource(path, chunk_size=100).create_reader(ctx())
    reader.add_splits(range_splits(path, len(data), 333))
    assert drain(reader, max_records=17) == [f"line {i}" for i in range(500)]
    assert reader.snapshot(1) == []


def test_create_splits_small_input_gives_one_split_per_non_empty_file(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_bytes(b"b1\nb2\n")
    (tmp_path / "a.txt").write_bytes(b"a1\n")
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / ".hidden").write_bytes(b"secret\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_bytes(b"c\n")
    splits = TextFileSource(tmp_path).create_splits(parallelism=4)
    assert [(Path(s.path).name, s.start, s.end, s.offset) for s in splits] == [
        ("a.txt", 0, 3, 0),
        ("b.txt", 0, 6, 0),
    ]
    assert len({s.split_id for s in splits}) == 2
    reader = TextFileSource(tmp_path).create_reader(ctx())
    reader.add_splits(splits)
    assert drain(reader) == ["a1", "b1", "b2"]


def test_create_splits_large_input_gives_at_least_parallelism_contiguous_splits(
    tmp_path: Path,
) -> None:
    lines = [f"record number {i:07d} " + "x" * (i % 50) for i in range(20_000)]
    data = ("\n".join(lines) + "\n").encode()
    assert len(data) >= 3 * TextFileSource.MIN_SPLIT_BYTES
    path = tmp_path / "big.txt"
    path.write_bytes(data)
    source = TextFileSource(path)
    for parallelism in (1, 2, 3):
        splits = source.create_splits(parallelism)
        assert len(splits) >= parallelism
        assert splits[0].start == 0 and splits[-1].end == len(data)
        assert all(a.end == b.start for a, b in itertools.pairwise(splits))
        got: list[str] = []
        for subtask in range(parallelism):
            reader = source.create_reader(ctx())
            reader.add_splits(splits[subtask::parallelism])
            got.extend(drain(reader, max_records=4096))
        assert sorted(got) == sorted(lines)


def test_glob_and_missing_paths(tmp_path: Path) -> None:
    (tmp_path / "x1.log").write_bytes(b"1\n")
    (tmp_path / "x2.log").write_bytes(b"2\n")
    (tmp_path / "x.txt").write_bytes(b"3\n")
    splits = TextFileSource(str(tmp_path / "x*.log")).create_splits(2)
    assert [Path(s.path).name for s in splits] == ["x1.log", "x2.log"]
    missing = str(tmp_path / "nope.txt")
    with pytest.raises(ConfigurationError, match=r"nope\.txt"):
        TextFileSource(missing).create_splits(1)
    with pytest.raises(ConfigurationError, match=r"\*\.csv"):
        TextFileSource(str(tmp_path / "*.csv")).create_splits(1)


def test_encodings_that_do_not_write_newline_as_one_byte_are_rejected() -> None:
    with pytest.raises(ConfigurationError, match="utf-16"):
        TextFileSource("whatever", encoding="utf-16")
    with pytest.raises(ConfigurationError, match="no-such-codec"):
        TextFileSource("whatever", encoding="no-such-codec")


def test_latin1_encoding(tmp_path: Path) -> None:
    path = tmp_path / "l1.txt"
    path.write_bytes("café\nnaïve\n".encode("latin-1"))
    reader = TextFileSource(path, encoding="latin-1").create_reader(ctx())
    reader.add_splits(TextFileSource(path).create_splits(1))
    assert drain(reader) == ["café", "naïve"]


def test_zero_splits_is_exhausted_at_once(tmp_path: Path) -> None:
    reader = TextFileSource(tmp_path).create_reader(ctx())
    assert reader.exhausted
    assert reader.poll(10) == []
    assert reader.snapshot(1) == []


@pytest.mark.parametrize("chunk_size", [1, 5, 1 << 20])
def test_snapshot_restore_at_every_position_resumes_exactly(
    tmp_path: Path, chunk_size: int
) -> None:
    data = b"a\r\nbb\n\nccc\r\n\xc3\xa9t\xc3\xa9\ndddd\n\n\neeeee\nlast"
    path = tmp_path / "resume.txt"
    path.write_bytes(data)
    want = expected_lines(data)
    source = TextFileSource(path, chunk_size=chunk_size)
    splits = range_splits(path, len(data), 9)
    for cut in range(len(want) + 1):
        first = source.create_reader(ctx())
        first.add_splits(splits)
        before: list[str] = []
        while len(before) < cut:
            before.extend(first.poll(min(2, cut - len(before))))
        state = pickle.loads(pickle.dumps(first.snapshot(1)))
        first.close()
        # Restore twice from the same states: realignment must be idempotent.
        for _ in range(2):
            second = source.create_reader(ctx())
            second.add_splits(state)
            assert before + drain(second, max_records=3) == want, cut
            second.close()


def test_snapshot_before_first_poll_keeps_unaligned_offset(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    path.write_bytes(b"0123456789\nabc\n")
    split = TextFileSplit("s", str(path), 4, 15, 4)
    reader = TextFileSource(path).create_reader(ctx())
    reader.add_splits([split])
    assert reader.snapshot(1) == [split]
    assert reader.poll(10) == ["abc"]
    assert reader.exhausted
    assert reader.snapshot(1) == []


def test_restored_states_can_be_redistributed_across_readers(tmp_path: Path) -> None:
    lines = [f"row-{i}" for i in range(200)]
    path = tmp_path / "r.txt"
    path.write_bytes(("\n".join(lines) + "\n").encode())
    source = TextFileSource(path, chunk_size=64)
    splits = range_splits(path, path.stat().st_size, 150)
    readers = [source.create_reader(ctx()) for _ in range(2)]
    got: list[str] = []
    for k, reader in enumerate(readers):
        reader.add_splits(splits[k::2])
        got.extend(reader.poll(7))
    states = [s for r in readers for s in r.snapshot(1)]
    for reader in readers:
        reader.close()
    restored = [source.create_reader(ctx()) for _ in range(3)]
    for k, reader in enumerate(restored):
        reader.add_splits(states[k::3])
        got.extend(drain(reader, max_records=11))
    assert sorted(got) == sorted(lines)
    assert len(got) == len(lines)


def bad_file(tmp_path: Path) -> tuple[Path, int, int]:
    good = b"first\nsecond\n"
    bad_line = b"th\xffird\r\n"
    path = tmp_path / "bad.txt"
    path.write_bytes(good + bad_line + b"fourth\n")
    return path, len(good), len(good) + 2


@pytest.mark.parametrize("chunk_size", [3, 1 << 20])
def test_invalid_utf8_returns_earlier_lines_then_raises(tmp_path: Path, chunk_size: int) -> None:
    path, line_start, bad_byte = bad_file(tmp_path)
    reader = TextFileSource(path, chunk_size=chunk_size).create_reader(ctx())
    reader.add_splits(TextFileSource(path).create_splits(1))
    assert reader.poll(100) == ["first", "second"]
    assert not reader.exhausted
    # The snapshot points at the bad line, so nothing accepted is lost or repeated.
    assert [s.offset for s in reader.snapshot(1)] == [line_start]
    with pytest.raises(SourceDecodeError) as info:
        reader.poll(100)
    err = info.value
    assert err.path == str(path)
    assert err.offset == bad_byte
    assert str(path) in str(err)
    assert f"byte offset {bad_byte}" in str(err)
    assert f"line starting at byte offset {line_start}" in str(err)
    restored = pickle.loads(pickle.dumps(err))
    assert (restored.path, restored.offset) == (err.path, err.offset)


def test_invalid_line_first_in_poll_raises_at_once(tmp_path: Path) -> None:
    path, _line_start, bad_byte = bad_file(tmp_path)
    reader = TextFileSource(path).create_reader(ctx())
    reader.add_splits(TextFileSource(path).create_splits(1))
    assert reader.poll(2) == ["first", "second"]
    with pytest.raises(SourceDecodeError) as info:
        reader.poll(2)
    assert info.value.offset == bad_byte


def test_dead_letter_receives_bad_line_and_reading_continues(tmp_path: Path) -> None:
    path, line_start, _ = bad_file(tmp_path)
    dead: list[dict[str, Any]] = []
    source = TextFileSource(path, chunk_size=4, on_error="dead_letter")
    reader = source.create_reader(ctx(dead_letter=dead.append))
    reader.add_splits(source.create_splits(1))
    assert drain(reader, max_records=100) == ["first", "second", "fourth"]
    assert len(dead) == 1
    entry = dead[0]
    assert entry["file"] == str(path)
    assert entry["offset"] == line_start
    assert entry["line"] == "th\\xffird"
    assert "0xff" in entry["error"]


def test_dead_letter_offsets_stay_exact_across_restore(tmp_path: Path) -> None:
    path = tmp_path / "mixed.txt"
    path.write_bytes(b"ok1\n\xfe\nok2\n\xff\xff\nok3\n")
    dead: list[dict[str, Any]] = []
    source = TextFileSource(path, on_error="dead_letter")
    reader = source.create_reader(ctx(dead_letter=dead.append))
    reader.add_splits(source.create_splits(1))
    assert reader.poll(2) == ["ok1", "ok2"]
    state = reader.snapshot(1)
    assert state[0].offset == len(b"ok1\n\xfe\nok2\n")
    restored = source.create_reader(ctx(dead_letter=dead.append))
    restored.add_splits(state)
    assert drain(restored) == ["ok3"]
    assert [d["offset"] for d in dead] == [4, 10]


def test_unknown_split_type_is_rejected(tmp_path: Path) -> None:
    reader = TextFileSource(tmp_path).create_reader(ctx())
    with pytest.raises(ConfigurationError, match="TextFileSplit"):
        reader.add_splits([object()])


def test_reader_reads_in_large_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [f"{i}" for i in range(50_000)]
    path = tmp_path / "chunks.txt"
    path.write_bytes(("\n".join(lines) + "\n").encode())
    sizes: list[int] = []

    class CountingFileIO(io.FileIO):
        def read(self, size: int | None = -1, /) -> bytes:
            sizes.append(-1 if size is None else size)
            return super().read(size)

    monkeypatch.setattr(io, "FileIO", CountingFileIO)
    source = TextFileSource(path, chunk_size=64 * 1024)
    reader = source.create_reader(ctx())
    reader.add_splits(source.create_splits(1))
    assert drain(reader, max_records=1000) == lines
    # ~290 KB in 64 KiB reads; the split ends at the last newline, so no read sees EOF.
    assert len(sizes) == -(-path.stat().st_size // (64 * 1024))
    assert set(sizes) == {64 * 1024}
