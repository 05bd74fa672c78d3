"""Reading text files: one record per line, in byte-range splits, re-settable.

Splits are byte ranges ``[start, end)`` of a file, aligned by the Hadoop rule: a line
belongs to the split holding its first byte. A reader of a split with ``start > 0``
seeks to ``start - 1`` and skips through the next ``b"\\n"``; it reads lines while they
start before ``end``, finishing the last one past ``end`` if needed. The split state's
``offset`` is the byte offset of the next line to return, so a restored reader seeks
there and resumes exactly. Re-aligning is idempotent: it happens only while
``offset == start``, i.e. before the split returned anything.

Files are read in binary, in large chunks, and decoded a batch of lines at a time;
only a batch that fails to decode is decoded line by line, to find the bad line.

The source is :class:`~epochstream.connectors.formats.FileSource` (``format="text"``,
or :class:`~epochstream.connectors.formats.TextFileSource`); this module holds the
text reading it shares with JSON lines and CSV.

Example::

    splits = byte_range_splits(list_files("/data/logs/*.log", owner="me"), 4, 64 * 1024)
    reader = TextFileReader("utf-8", 1 << 20, None)
    reader.add_splits(splits)
    lines = reader.poll(1000)
"""

from __future__ import annotations

import codecs
import glob
import io
import itertools
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from epochstream.connectors.base import SourceReader
from epochstream.exceptions import ConfigurationError, SourceDecodeError

__all__ = [
    "LineParser",
    "TextFileReader",
    "TextFileSplit",
    "byte_range_splits",
    "check_encoding",
    "list_files",
]

DeadLetter = Callable[[dict[str, Any]], None]

_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class TextFileSplit:
    """A byte range ``[start, end)`` of ``path``; ``offset`` is the next line to read.

    Example::

        TextFileSplit(split_id="/in/a.txt:0", path="/in/a.txt", start=0, end=4096, offset=0)
    """

    split_id: str
    path: str
    start: int
    end: int
    offset: int


class LineParser(Protocol):
    """Turns decoded lines of ``path`` into records (JSON lines, CSV).

    ``starts[i]`` is the byte offset of ``lines[i]``. A bad line goes to ``dead_letter``
    when set; otherwise parsing stops there and the error (naming path and offset) is
    returned with the records before it.

    Example::

        records, error = JsonLinesParser().parse("/in/a.jsonl", lines, starts, None)
    """

    def parse(
        self, path: str, lines: list[str], starts: list[int], dead_letter: DeadLetter | None
    ) -> tuple[list[Any], SourceDecodeError | None]: ...


class TextFileReader(SourceReader):
    """Reads its text splits one after the other.

    A line that does not decode goes to ``dead_letter`` when set; otherwise the records
    before it are returned and the next :meth:`poll` raises :class:`SourceDecodeError`.

    Example::

        reader = TextFileReader("utf-8", 1 << 20, dead_letter=None)
        reader.add_splits([TextFileSplit("a:0", "a.txt", 0, 100, 0)])
        reader.poll(10)
    """

    def __init__(
        self,
        encoding: str,
        chunk_size: int,
        dead_letter: DeadLetter | None,
        parser: LineParser | None = None,
        *,
        monitored: bool = False,
    ) -> None:
        self._encoding = encoding
        self._chunk_size = chunk_size
        self._dead_letter = dead_letter
        self._parser = parser
        self._monitored = monitored
        self._cursors: deque[_SplitCursor] = deque()
        self._error: SourceDecodeError | None = None

    def add_splits(self, splits: list[Any]) -> None:
        for split in splits:
            if not isinstance(split, TextFileSplit):
                raise ConfigurationError(
                    f"TextFileReader got a {type(split).__qualname__} split, not a TextFileSplit"
                )
            self._cursors.append(_SplitCursor(split, self._encoding, self._chunk_size))

    def poll(self, max_records: int) -> list[Any]:
        if self._error is not None:
            raise self._error
        out: list[str] = []
        cursors = self._cursors
        while cursors and len(out) < max_records:
            cursor = cursors[0]
            lines, error = self._read(cursor, max_records - len(out))
            if out:
                out.extend(lines)
            else:
                out = lines
            if error is not None:
                if not out:
                    raise error
                # The runtime emits what was accepted; the failure surfaces on the next poll.
                self._error = error
                return out
            if cursor.done:
                cursor.close()
                cursors.popleft()
        return out

    def poll_splits(self, max_records: int) -> list[tuple[Any, list[Any], bool]]:
        if self._error is not None:
            raise self._error
        groups: list[tuple[Any, list[Any], bool]] = []
        left = max_records
        cursors = self._cursors
        while cursors and left > 0:
            cursor = cursors[0]
            lines, error = self._read(cursor, left)
            left -= len(lines)
            if error is not None:
                if not groups and not lines:
                    raise error
                self._error = error  # what was accepted goes out; the failure comes next poll
                if lines:
                    groups.append((cursor.split_id, lines, False))
                return groups
            done = cursor.done
            if lines or done:
                groups.append((cursor.split_id, lines, done))
            if done:
                cursor.close()
                cursors.popleft()
        return groups

    def _read(self, cursor: _SplitCursor, n: int) -> tuple[list[Any], SourceDecodeError | None]:
        parser = self._parser
        if parser is None:
            return cursor.read(n, self._dead_letter)
        starts: list[int] = []
        lines, error = cursor.read(n, self._dead_letter, starts)
        records, parse_error = parser.parse(cursor.path, lines, starts, self._dead_letter)
        # A bad record among the lines comes before a line that did not decode.
        return records, parse_error or error

    @property
    def exhausted(self) -> bool:
        """A monitored input never ends: new files may still arrive."""
        return self.needs_splits and not self._monitored

    @property
    def needs_splits(self) -> bool:
        """Every split is read (a reader that failed waits for the failure, not splits)."""
        return not self._cursors and self._error is None

    def snapshot(self, checkpoint_id: int) -> list[Any]:
        return [cursor.state() for cursor in self._cursors]

    def close(self) -> None:
        for cursor in self._cursors:
            cursor.close()


class _SplitCursor:
    """Position and read-ahead buffer of one split.

    ``offset`` is the absolute offset of the next line to return. ``_lines`` holds the
    complete lines read ahead (without ``b"\\n"``) that belong to this split, ``_tail``
    the bytes of a line not yet terminated in what was read so far.
    """

    __slots__ = (
        "_chunk_size",
        "_encoding",
        "_eof_line",
        "_file",
        "_li",
        "_lines",
        "_reading_done",
        "_tail",
        "end",
        "offset",
        "path",
        "split_id",
        "start",
    )

    def __init__(self, split: TextFileSplit, encoding: str, chunk_size: int) -> None:
        self.split_id = split.split_id
        self.path = split.path
        self.start = split.start
        self.end = split.end
        self.offset = split.offset
        self._encoding = encoding
        self._chunk_size = chunk_size
        self._file: io.FileIO | None = None
        self._lines: list[bytes] = []
        self._li = 0
        self._tail = b""
        # True when the last element of _lines is a final line without b"\n".
        self._eof_line = False
        self._reading_done = self.offset >= self.end

    @property
    def done(self) -> bool:
        return self._reading_done and self._li >= len(self._lines)

    def state(self) -> TextFileSplit:
        return TextFileSplit(self.split_id, self.path, self.start, self.end, self.offset)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def read(
        self, n: int, dead_letter: DeadLetter | None, starts: list[int] | None = None
    ) -> tuple[list[str], SourceDecodeError | None]:
        """Up to ``n`` lines; fewer only when the split is done or a line failed to decode.

        ``starts``, when given, receives each returned line's byte offset (for parsers
        that must name the place of a bad record).
        """
        out: list[str] = []
        while len(out) < n:
            if self._li >= len(self._lines):
                if self._reading_done:
                    break
                self._fill()
                continue
            stop = min(self._li + n - len(out), len(self._lines))
            batch = self._lines[self._li : stop]
            terminated = not (self._eof_line and stop == len(self._lines))
            decoded = self._decode_batch(batch, terminated)
            if decoded is None:
                error = self._decode_lines(batch, terminated, out, dead_letter, starts)
                if error is not None:
                    return out, error
            else:
                out.extend(decoded)
                if starts is not None:
                    starts.extend(
                        itertools.accumulate((len(r) + 1 for r in batch[:-1]), initial=self.offset)
                    )
                self.offset += sum(map(len, batch)) + len(batch) - (0 if terminated else 1)
                self._li = stop
        return out, None

    def _decode_batch(self, batch: list[bytes], terminated: bool) -> list[str] | None:
        """All of ``batch`` decoded at once, or None if some line needs a closer look."""
        try:
            text = b"\n".join(batch).decode(self._encoding)
        except UnicodeDecodeError:
            return None
        if "\r" in text:
            # Interior lines end right before a joining "\n"; the last one needs its own.
            if terminated:
                text = (text + "\n").replace("\r\n", "\n")[:-1]
            else:
                text = text.replace("\r\n", "\n")
        lines = text.split("\n")
        return lines if len(lines) == len(batch) else None

    def _decode_lines(
        self,
        batch: list[bytes],
        terminated: bool,
        out: list[str],
        dead_letter: DeadLetter | None,
        starts: list[int] | None,
    ) -> SourceDecodeError | None:
        """Decode ``batch`` line by line into ``out``; stop at a bad line unless dead-lettered."""
        last = len(batch) - 1
        for k, raw in enumerate(batch):
            has_newline = terminated or k < last
            try:
                line = raw.decode(self._encoding)
            except UnicodeDecodeError as exc:
                if dead_letter is None:
                    return self._decode_error(exc)
                bad = raw.decode(self._encoding, errors="backslashreplace")
                if has_newline and bad.endswith("\r"):
                    bad = bad[:-1]
                dead_letter(
                    {"file": self.path, "offset": self.offset, "error": str(exc), "line": bad}
                )
            else:
                if has_newline and line.endswith("\r"):
                    line = line[:-1]
                out.append(line)
                if starts is not None:
                    starts.append(self.offset)
            self.offset += len(raw) + (1 if has_newline else 0)
            self._li += 1
        return None

    def _decode_error(self, exc: UnicodeDecodeError) -> SourceDecodeError:
        byte_offset = self.offset + exc.start
        return SourceDecodeError(
            f"cannot decode {self.path!r} as {self._encoding}: byte offset {byte_offset} "
            f"(line starting at byte offset {self.offset}): {exc.reason}",
            path=self.path,
            offset=byte_offset,
        )

    def _open(self) -> io.FileIO:
        f = io.FileIO(self.path, "r")
        self._file = f
        if self.offset == self.start and self.start > 0:
            self.offset = self._align(f)
            if self.offset >= self.end:
                self._finish_reading()
                return f
        f.seek(self.offset)
        return f

    def _align(self, f: io.FileIO) -> int:
        """The offset of the first line starting at or after ``start`` (Hadoop rule)."""
        pos = self.start - 1
        f.seek(pos)
        while True:
            chunk = f.read(self._chunk_size)
            if not chunk:
                return pos
            nl = chunk.find(b"\n")
            if nl >= 0:
                return pos + nl + 1
            pos += len(chunk)

    def _fill(self) -> None:
        """Read ahead until at least one complete line of this split is buffered, or it ends."""
        f = self._file if self._file is not None else self._open()
        self._lines = []
        self._li = 0
        while not self._reading_done:
            # data[0] is at absolute offset `offset`: every line before it was returned.
            chunk = f.read(self._chunk_size)
            if not chunk:
                if self._tail:
                    self._lines = [self._tail]
                    self._eof_line = True
                    self._tail = b""
                self._finish_reading()
                return
            data = self._tail + chunk if self._tail else chunk
            # The line holding byte end-1 is this split's last: its newline is the first
            # newline at or after end-1.
            cut = data.find(b"\n", max(self.end - 1 - self.offset, 0))
            if cut >= 0:
                self._lines = data[:cut].split(b"\n")
                self._tail = b""
                self._finish_reading()
                return
            nl = data.rfind(b"\n")
            if nl < 0:
                self._tail = data
                continue
            self._lines = data[:nl].split(b"\n")
            self._tail = data[nl + 1 :]
            return

    def _finish_reading(self) -> None:
        self._reading_done = True
        self.close()


def list_files(path: str, *, owner: str, allow_none: bool) -> list[str]:
    """The regular, non-hidden files of ``path`` (a file, a directory or a glob), sorted.

    Names starting with ``.`` are hidden (writers' in-progress files). A missing path or
    a glob matching nothing is a ConfigurationError naming ``owner``, unless
    ``allow_none`` (a monitored input that may still be empty).

    Example: ``list_files("/in/*.jsonl", owner="from_files", allow_none=False)``
    """
    if os.path.isdir(path):
        with os.scandir(path) as entries:
            names = [e.path for e in entries if not e.name.startswith(".") and e.is_file()]
        return sorted(names)
    if os.path.isfile(path):
        return [path]
    if _GLOB_CHARS.intersection(path):
        matches = sorted(p for p in glob.glob(path) if os.path.isfile(p))
        if not matches and not allow_none:
            raise ConfigurationError(f"{owner}: glob {path!r} matches no files")
        return matches
    if allow_none and os.path.isdir(os.path.dirname(path) or "."):
        return []
    raise ConfigurationError(f"{owner}: path {path!r} does not exist")


def byte_range_splits(
    files: list[str], parallelism: int, min_split_bytes: int
) -> list[TextFileSplit]:
    """Byte ranges of ``files``: at least ``parallelism`` of them when the files total
    ``parallelism * min_split_bytes`` or more, else one per file; empty files get none.

    Example: ``byte_range_splits(["/in/a.txt"], parallelism=4, min_split_bytes=65536)``
    """
    sizes = [(p, os.path.getsize(p)) for p in files]
    total = sum(size for _, size in sizes)
    # Floor division guarantees sum(ceil(size / target)) >= parallelism.
    target = total // parallelism if total >= parallelism * min_split_bytes else None
    splits: list[TextFileSplit] = []
    for path, size in sizes:
        if size == 0:
            continue
        pieces = 1 if target is None else -(-size // target)
        bounds = [size * i // pieces for i in range(pieces + 1)]
        for start, end in itertools.pairwise(bounds):
            splits.append(TextFileSplit(f"{path}:{start}", path, start, end, start))
    return splits


def check_encoding(encoding: str) -> str:
    """Reject unknown encodings and those that do not write ``"\\n"`` as the byte ``\\n``.

    Example: ``check_encoding("latin-1")`` returns ``"latin-1"``; ``"utf-16"`` is refused.
    """
    try:
        codecs.lookup(encoding)
    except LookupError as exc:
        raise ConfigurationError(f"TextFileSource: unknown encoding {encoding!r}") from exc
    if "\r\n".encode(encoding) != b"\r\n":
        raise ConfigurationError(
            f"TextFileSource: encoding {encoding!r} does not encode newlines as single bytes; "
            "lines are split on b'\\n', so use an ASCII-compatible encoding"
        )
    return encoding
