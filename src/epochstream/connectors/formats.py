"""File sources in several formats, optionally monitoring their directory for new files.

``format``: ``"text"`` (one record per line), ``"jsonl"`` (one JSON value per line;
blank lines are skipped), ``"csv"`` (a header line, then one dict per row, values as
strings; quoted fields must not contain newlines) or ``"parquet"`` (row groups as
splits, read as Arrow batches, rows delivered as dicts).

Splits: text and JSON lines are byte ranges (see :mod:`epochstream.connectors.files`),
CSV one split per file (rows are read after the header), Parquet one split per row
group; positions are byte offsets or rows, so a restore resumes exactly.

Bad records (a line that is not JSON, a row with the wrong number of fields, a row
group that does not read) fail the job by default with a :class:`SourceDecodeError`
naming the file, the byte offset or row, and the reason (no restarts: the input would
fail again). With ``on_error="dead_letter"`` they go, with that context, to the
stream's dead-letter side output ``stream.get_side_output(es.DEAD_LETTERS)``; nothing is
dropped silently.

``monitor_interval`` (seconds): the job master lists the path again at that interval
and new files become splits (see :mod:`epochstream.connectors.enumerators`); the source
never ends. Files must appear complete: write them under a name starting with ``.``
(ignored) and rename them into place. A file is read once, when first seen; later
changes to it are not read.

Guarantee: exactly-once (re-settable positions in checkpoints; the enumerator's list of
seen files is checkpointed with them).

Example::

    env.from_files("/data/in/*.jsonl", format="jsonl", monitor_interval=1.0)
"""

from __future__ import annotations

import csv
import json
import os
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

from epochstream.connectors.base import Source, SourceContext, SourceReader
from epochstream.connectors.enumerators import SplitEnumerator
from epochstream.connectors.files import (
    DeadLetter,
    TextFileReader,
    TextFileSplit,
    byte_range_splits,
    check_encoding,
    list_files,
)
from epochstream.core.arrow import rows_of, same_columns, schema_difference
from epochstream.exceptions import ConfigurationError, SourceDecodeError

__all__ = [
    "CsvParser",
    "FileSource",
    "JsonLinesParser",
    "MonitoringFileEnumerator",
    "ParquetReader",
    "ParquetSplit",
    "TextFileSource",
]

FORMATS = ("text", "jsonl", "csv", "parquet")
ON_ERROR = ("fail", "dead_letter")
_LINE_LIMIT = 200


class FileSource(Source):
    """Records of the files at a path, directory or glob (module docstring).

    Guarantee: exactly-once (split positions and the seen files in every checkpoint).

    Example::

        env.from_source(FileSource("/in", format="csv", on_error="dead_letter"))
    """

    MIN_SPLIT_BYTES = 64 * 1024

    def __init__(
        self,
        path: str | os.PathLike[str],
        format: str = "text",
        *,
        monitor_interval: float | None = None,
        on_error: str = "fail",
        encoding: str = "utf-8",
        chunk_size: int = 1 << 20,
        batch_size: int | None = None,
        columns: tuple[str, ...] | None = None,
    ) -> None:
        if format not in FORMATS:
            raise ConfigurationError(f"from_files: format must be one of {FORMATS}, got {format!r}")
        if on_error not in ON_ERROR:
            raise ConfigurationError(
                f"from_files: on_error must be one of {ON_ERROR}, got {on_error!r}"
            )
        if monitor_interval is not None and not monitor_interval > 0:
            raise ConfigurationError(
                f"from_files: monitor_interval must be > 0 seconds, got {monitor_interval!r}"
            )
        if chunk_size < 1:
            raise ConfigurationError(f"from_files: chunk_size must be >= 1, got {chunk_size}")
        if batch_size is not None and (format != "parquet" or batch_size < 1):
            raise ConfigurationError(
                f"from_files: batch_size (columnar record batches) is for Parquet and must "
                f"be >= 1, got {batch_size!r} for format {format!r}"
            )
        #: Columnar: Parquet rows as Arrow record batches of up to this many rows.
        self.batch_size = batch_size
        self.columnar = batch_size is not None
        if columns is not None and format != "parquet":
            raise ConfigurationError(
                f"from_files: columns (read only these) is for Parquet, not {format!r}"
            )
        #: Parquet: read only these columns (None: all), e.g. what a SQL query uses.
        self.columns = tuple(columns) if columns is not None else None
        # Absolute now, in the driver: slots may run with another working directory.
        self.path = os.path.abspath(os.fspath(path))
        self.format = format
        self.monitor_interval = monitor_interval
        self.on_error = on_error
        self.encoding = check_encoding(encoding)
        self.chunk_size = chunk_size
        self.bounded = monitor_interval is None
        # Fail in the driver, not in every slot: a missing input is a configuration error.
        self.files()

    def files(self) -> list[str]:
        """The files at the path now (a monitored path may have none yet)."""
        return list_files(self.path, owner="from_files", allow_none=not self.bounded)

    def create_splits(self, parallelism: int) -> list[Any]:
        """Splits of every file at the path now."""
        return self.splits_of(self.files(), parallelism)

    def splits_of(self, files: list[str], parallelism: int) -> list[Any]:
        """The splits of ``files`` in this source's format."""
        if self.format == "parquet":
            return [s for path in files for s in _row_group_splits(path)]
        if self.format == "csv":
            sizes = [(p, os.path.getsize(p)) for p in files]
            return [TextFileSplit(f"{p}:0", p, 0, size, 0) for p, size in sizes if size > 0]
        return byte_range_splits(files, parallelism, self.MIN_SPLIT_BYTES)

    def create_enumerator(self, parallelism: int, restored: Any) -> SplitEnumerator:
        """Monitored: a :class:`MonitoringFileEnumerator`; else the files present now."""
        if self.monitor_interval is None:
            return super().create_enumerator(parallelism, restored)
        return MonitoringFileEnumerator(self, parallelism, restored)

    def create_reader(self, ctx: SourceContext) -> SourceReader:
        dead_letter: DeadLetter | None = None
        if self.on_error == "dead_letter":
            if ctx.dead_letter is None:
                raise ConfigurationError(
                    f"from_files({self.path!r}, on_error='dead_letter'): the stream's dead "
                    "letters are not consumed; read them with "
                    "stream.get_side_output(es.DEAD_LETTERS)"
                )
            dead_letter = ctx.dead_letter
        monitored = not self.bounded
        if self.format == "parquet":
            return ParquetReader(
                dead_letter, monitored=monitored, batch_size=self.batch_size, columns=self.columns
            )
        parser = {"text": None, "jsonl": JsonLinesParser(), "csv": CsvParser(self.encoding)}[
            self.format
        ]
        return TextFileReader(
            self.encoding, self.chunk_size, dead_letter, parser, monitored=monitored
        )


class TextFileSource(FileSource):
    """Lines of a file, of a directory's non-hidden regular files, or of a glob's files:
    ``FileSource(path, "text")``, the source of ``env.from_text_file``.

    Guarantee: exactly-once (split byte offsets in every checkpoint).

    ``chunk_size`` is the read size in bytes. At least ``parallelism`` splits are made
    when the input totals ``parallelism * MIN_SPLIT_BYTES`` or more, else one per file;
    empty files get no split. ``on_error`` as :class:`FileSource`.

    Example::

        TextFileSource("/data/in", encoding="latin-1").create_splits(parallelism=8)
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        encoding: str = "utf-8",
        chunk_size: int = 1 << 20,
        on_error: str = "fail",
    ) -> None:
        super().__init__(path, "text", encoding=encoding, chunk_size=chunk_size, on_error=on_error)


class MonitoringFileEnumerator(SplitEnumerator):
    """Lists the source's path every ``monitor_interval`` s; unseen files become splits.

    Its state is the sorted list of files seen, so a restored job reads on only files
    that appeared after the checkpoint.

    Example::

        enum = MonitoringFileEnumerator(source, parallelism=2, restored=None)
        enum.discover(clock.now())
    """

    def __init__(self, source: FileSource, parallelism: int, restored: Any) -> None:
        assert source.monitor_interval is not None
        self._source = source
        self._parallelism = parallelism
        self._interval = source.monitor_interval
        self._seen: set[str] = set(restored or ())
        self._due: float | None = None  # first discovery right away

    def initial_splits(self) -> list[Any]:
        return self._take_new()

    def discover(self, now: float) -> list[Any]:
        self._due = now + self._interval
        return self._take_new()

    def next_discovery(self) -> float | None:
        return 0.0 if self._due is None else self._due

    def snapshot(self) -> Any:
        return sorted(self._seen)

    def _take_new(self) -> list[Any]:
        new = [p for p in self._source.files() if p not in self._seen]
        self._seen.update(new)
        return self._source.splits_of(new, self._parallelism)


class JsonLinesParser:
    """Parses each non-blank line as one JSON value.

    Example::

        JsonLinesParser().parse("/in/a.jsonl", ['{"a": 1}'], [0], None)   # ([{"a": 1}], None)
    """

    def parse(
        self, path: str, lines: list[str], starts: list[int], dead_letter: DeadLetter | None
    ) -> tuple[list[Any], SourceDecodeError | None]:
        loads = json.loads
        try:
            return [loads(line) for line in lines if line.strip()], None
        except ValueError:
            pass  # find the bad line(s) below
        out: list[Any] = []
        for line, start in zip(lines, starts, strict=True):
            if not line.strip():
                continue
            try:
                out.append(loads(line))
            except ValueError as exc:
                reason = f"not JSON: {exc}"
                if dead_letter is None:
                    return out, _bad_record(path, "JSON lines", start, reason, line)
                dead_letter(_dead(path, start, reason, line))
        return out, None


class CsvParser:
    """Parses CSV rows into dicts keyed by the file's header (its first line).

    Example::

        CsvParser("utf-8").parse("/in/a.csv", ["id,name", "1,ann"], [0, 8], None)
    """

    def __init__(self, encoding: str) -> None:
        self._encoding = encoding
        self._headers: dict[str, list[str]] = {}

    def parse(
        self, path: str, lines: list[str], starts: list[int], dead_letter: DeadLetter | None
    ) -> tuple[list[Any], SourceDecodeError | None]:
        header = self._header(path)
        width = len(header)
        out: list[Any] = []
        rows: list[list[str] | str]
        try:
            rows = list(csv.reader(lines, strict=True))
        except csv.Error:
            rows = []
        if len(rows) != len(lines):
            # A quote left open swallowed later lines: parse line by line to find it.
            rows = [_csv_row(line) for line in lines]
        for line, start, row in zip(lines, starts, rows, strict=True):
            if start == 0 or not line:
                continue  # the header, or a blank line
            if isinstance(row, str) or len(row) != width:
                reason = (
                    row
                    if isinstance(row, str)
                    else (f"expected {width} fields (header {header}), got {len(row)}")
                )
                if dead_letter is None:
                    return out, _bad_record(path, "CSV", start, reason, line)
                dead_letter(_dead(path, start, reason, line))
                continue
            out.append(dict(zip(header, row, strict=True)))
        return out, None

    def _header(self, path: str) -> list[str]:
        header = self._headers.get(path)
        if header is None:
            with open(path, "rb") as f:
                first = f.readline()
            text = first.decode(self._encoding).rstrip("\r\n")
            header = next(csv.reader([text]), [])
            if not header:
                raise SourceDecodeError(
                    f"cannot read {path!r} as CSV: byte offset 0: the header line is empty",
                    path=path,
                    offset=0,
                )
            self._headers[path] = header
        return header


@dataclass(frozen=True)
class ParquetSplit:
    """Row group ``row_group`` of ``path``; ``row`` rows of it were read.

    Example::

        ParquetSplit(split_id="/in/a.parquet#0", path="/in/a.parquet", row_group=0, row=0)
    """

    split_id: str
    path: str
    row_group: int
    row: int


def _row_group_splits(path: str) -> list[ParquetSplit]:
    import pyarrow.parquet as pq

    try:
        groups = pq.ParquetFile(path).metadata.num_row_groups
    except Exception:
        # Unreadable footer: one split whose reader reports the error (or dead-letters it).
        groups = 1
    return [ParquetSplit(f"{path}#{g}", path, g, 0) for g in range(groups)]


class ParquetReader(SourceReader):
    """Reads Parquet row groups as Arrow tables (only ``columns`` when given) and
    delivers their rows as dicts, or with ``batch_size`` as record batches of up to that
    many rows (columnar).

    A row group that does not read fails with :class:`SourceDecodeError` naming file,
    row group and reason, or goes to ``dead_letter`` as one record.

    Example::

        reader = ParquetReader(None)
        reader.add_splits([ParquetSplit("/in/a.parquet#0", "/in/a.parquet", 0, 0)])
        reader.poll(1000)
    """

    def __init__(
        self,
        dead_letter: DeadLetter | None,
        *,
        monitored: bool = False,
        batch_size: int | None = None,
        columns: tuple[str, ...] | None = None,
    ) -> None:
        self._batch_size = batch_size
        self._columns = list(columns) if columns is not None else None
        self._dead_letter = dead_letter
        self._monitored = monitored
        self._splits: deque[ParquetSplit] = deque()
        self._table: Any = None  # the first split's row group, once read
        # Columnar: the first row group's schema, which every later one must match
        # (but for column order, integer widths and nullability) so that a file of
        # another schema is named here, not by an edge or an operator downstream.
        self._schema: Any = None

    def add_splits(self, splits: list[Any]) -> None:
        for split in splits:
            if not isinstance(split, ParquetSplit):
                raise ConfigurationError(
                    f"ParquetReader got a {type(split).__qualname__} split, not a ParquetSplit"
                )
            self._splits.append(split)

    def poll(self, max_records: int) -> Any:
        if self._batch_size is not None:
            return self._poll_batch(self._batch_size)
        out: list[Any] = []
        while self._splits and len(out) < max_records:
            split = self._splits[0]
            table = self._table if self._table is not None else self._read(split)
            if table is None:
                continue  # dead-lettered
            take = min(max_records - len(out), table.num_rows - split.row)
            if take > 0:
                out += rows_of(table.slice(split.row, take))
                split = replace(split, row=split.row + take)
                self._splits[0] = split
            if split.row >= table.num_rows:
                self._splits.popleft()
                self._table = None
        return out

    def _poll_batch(self, size: int) -> Any:
        """Up to ``size`` rows of the current row group as one record batch."""
        while self._splits:
            split = self._splits[0]
            table = self._table if self._table is not None else self._read(split)
            if table is None:
                continue  # dead-lettered
            take = min(size, table.num_rows - split.row)
            part = table.slice(split.row, take)
            self._splits[0] = replace(split, row=split.row + take)
            if split.row + take >= table.num_rows:
                self._splits.popleft()
                self._table = None
            if take > 0:
                return part.combine_chunks().to_batches()[0]
        return []

    def _read(self, split: ParquetSplit) -> Any:
        import pyarrow.parquet as pq

        try:
            table = pq.ParquetFile(split.path).read_row_group(
                split.row_group, columns=self._columns
            )
            if self._batch_size is not None:
                self._check_schema(table.schema)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if self._dead_letter is None:
                raise SourceDecodeError(
                    f"cannot read {split.path!r} as Parquet: row group {split.row_group}: {reason}",
                    path=split.path,
                    offset=split.row_group,
                ) from exc
            self._dead_letter({"file": split.path, "row_group": split.row_group, "error": reason})
            self._splits.popleft()
            return None
        self._table = table
        return table

    def _check_schema(self, schema: Any) -> None:
        """Raise ``ValueError`` saying how ``schema`` differs from the first row group's
        (the caller names the file and row group)."""
        if self._schema is None:
            self._schema = schema
            return
        first = self._schema
        if same_columns(schema, first):
            return
        raise ValueError(
            "its schema differs from the first row group's: "
            f"{schema_difference([first, schema]) or 'the schemas differ'}"
        )

    @property
    def exhausted(self) -> bool:
        return self.needs_splits and not self._monitored

    @property
    def needs_splits(self) -> bool:
        return not self._splits

    def snapshot(self, checkpoint_id: int) -> list[Any]:
        return list(self._splits)

    def close(self) -> None:
        self._table = None


def _csv_row(line: str) -> list[str] | str:
    """The fields of one CSV line, or the reason it is malformed."""
    try:
        return next(csv.reader([line], strict=True), [])
    except csv.Error as exc:
        return f"malformed CSV: {exc}"


def _excerpt(line: str) -> str:
    return line if len(line) <= _LINE_LIMIT else line[:_LINE_LIMIT] + "..."


def _bad_record(path: str, fmt: str, offset: int, reason: str, line: str) -> SourceDecodeError:
    return SourceDecodeError(
        f"cannot read {path!r} as {fmt}: line at byte offset {offset}: {reason}: "
        f"{_excerpt(line)!r}",
        path=path,
        offset=offset,
    )


def _dead(path: str, offset: int, reason: str, line: str) -> dict[str, Any]:
    return {"file": path, "offset": offset, "error": reason, "line": line}
