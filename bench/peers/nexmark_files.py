"""The Nexmark files as each peer reads them, derived once from ``write_nexmark_files``.

``write_nexmark_files(directory, config)`` (``epochstream.connectors.nexmark``) writes
``person.parquet``, ``auction.parquet`` and ``bid.parquet``. Peers read those events:

- Spark Structured Streaming reads Parquet, but one file is one micro-batch: it gets
  each table cut into ``parts`` Parquet files (:func:`ensure_parquet_parts`).
- PyFlink's pip package has no Parquet format (``flink-sql-parquet`` is a separate
  jar that only Maven serves): it gets the same rows as headerless CSV parts
  (:func:`ensure_csv_parts`), converted once, outside the timed run.
- Bytewax reads the Parquet files itself (pyarrow in its venv).

Needs pyarrow only (it runs in the peers' venvs too). Conversions are cached beside
the files, keyed by the source file's size and modification time.

Example::

    parts = ensure_csv_parts("/tmp/nexmark", 4)     # {"bid": "/tmp/nexmark/csv-4/bid", ...}
    total = event_count("/tmp/nexmark")
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

__all__ = ["COLUMNS", "TABLES", "ensure_csv_parts", "ensure_parquet_parts", "event_count"]

TABLES = ("person", "auction", "bid")
# Field order of the spec (/tmp/nexmark_spec.md); CSV columns and DDLs follow it.
COLUMNS: dict[str, tuple[str, ...]] = {
    "person": ("id", "name", "email_address", "credit_card", "city", "state", "date_time", "extra"),
    "auction": (
        "id",
        "item_name",
        "description",
        "initial_bid",
        "reserve",
        "date_time",
        "expires",
        "seller",
        "category",
        "extra",
    ),
    "bid": ("auction", "bidder", "price", "channel", "url", "date_time", "extra"),
}


def _source(directory: str, table: str) -> str:
    path = os.path.join(directory, f"{table}.parquet")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no Nexmark {table} file (write_nexmark_files writes it)")
    return path


def _stamp(path: str, parts: int) -> str:
    st = os.stat(path)
    return f"{st.st_size} {st.st_mtime_ns} {parts}\n"


def _fresh(out_dir: str, want: str) -> bool:
    stamp = os.path.join(out_dir, ".source")
    if not os.path.exists(stamp):
        return False
    with open(stamp, encoding="ascii") as f:
        return f.read() == want


def _mark(out_dir: str, want: str) -> None:
    with open(os.path.join(out_dir, ".source"), "w", encoding="ascii") as f:
        f.write(want)


def _pieces(src: str, columns: list[str], parts: int) -> Iterator[tuple[int, Any]]:
    """(part index, record batch) over ``src``'s rows cut into ``parts`` runs of rows,
    streamed: a table of tens of millions of events never sits in memory whole."""
    import pyarrow.parquet as pq

    source = pq.ParquetFile(src)
    rows = source.metadata.num_rows
    per = -(-rows // parts) if rows else 0
    at = 0
    for batch in source.iter_batches(batch_size=65_536, columns=columns):
        while batch.num_rows:
            part = at // per
            take = min(batch.num_rows, (part + 1) * per - at)
            yield part, batch.slice(0, take)
            batch = batch.slice(take)
            at += take


def _write_parts(src: str, table: str, out_dir: str, parts: int, kind: str) -> None:
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    writer: Any = None
    current = -1
    try:
        for part, piece in _pieces(src, list(COLUMNS[table]), parts):
            if part != current:
                if writer is not None:
                    writer.close()
                current = part
                name = os.path.join(out_dir, f"part-{part:04d}.{kind}")
                if kind == "csv":
                    options = pcsv.WriteOptions(include_header=False)
                    writer = pcsv.CSVWriter(name, piece.schema, write_options=options)
                else:
                    writer = pq.ParquetWriter(name, piece.schema)
            writer.write(piece)
    finally:
        if writer is not None:
            writer.close()


def _convert(directory: str, parts: int, kind: str) -> dict[str, str]:
    import shutil

    out: dict[str, str] = {}
    for table in TABLES:
        src = _source(directory, table)
        out_dir = os.path.join(directory, f"{kind}-{parts}", table)
        out[table] = out_dir
        want = _stamp(src, parts)
        if _fresh(out_dir, want):
            continue
        shutil.rmtree(out_dir, ignore_errors=True)
        os.makedirs(out_dir)
        _write_parts(src, table, out_dir, parts, kind)
        _mark(out_dir, want)
    return out


def ensure_csv_parts(directory: str, parts: int) -> dict[str, str]:
    """Each table as ``parts`` headerless CSV files in spec column order; table -> dir.

    Example: ``ensure_csv_parts("/tmp/nexmark", 4)["bid"]``
    """
    return _convert(directory, parts, "csv")


def ensure_parquet_parts(directory: str, parts: int) -> dict[str, str]:
    """Each table as ``parts`` Parquet files (one micro-batch each for Spark); table -> dir.

    Example: ``ensure_parquet_parts("/tmp/nexmark", 16)["bid"]``
    """
    return _convert(directory, parts, "parquet")


def event_count(directory: str) -> dict[str, int]:
    """Rows per table and ``"total"``: the events a query's rate is counted over.

    Example: ``event_count("/tmp/nexmark")["total"]``
    """
    import pyarrow.parquet as pq

    counts = {t: pq.ParquetFile(_source(directory, t)).metadata.num_rows for t in TABLES}
    counts["total"] = sum(counts.values())
    return counts
