"""The Nexmark files as the peers read them: the parts cut from each table
(bench/peers/nexmark_files.py) and Bytewax's resumable Parquet partition
(bench/peers/bytewax_nexmark.py), on files ``write_nexmark_files`` wrote.

No peer is installed: both need pyarrow only.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

import epochstream as es

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path[:0] = [str(BENCH / "peers"), str(BENCH)]
try:
    import bytewax_nexmark
    import nexmark_files
finally:
    del sys.path[:2]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("nexmark")
    es.sources.nexmark.write_nexmark_files(
        directory, es.sources.nexmark.NexmarkConfig(events=20_000)
    )
    return directory


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_parts_hold_every_row_in_order_in_spec_columns(files: Path, kind: str) -> None:
    convert = (
        nexmark_files.ensure_csv_parts if kind == "csv" else nexmark_files.ensure_parquet_parts
    )
    parts = convert(str(files), 7)  # 7 divides no table's row count
    for table, directory in parts.items():
        names = list(nexmark_files.COLUMNS[table])
        source = pq.read_table(files / f"{table}.parquet").select(names)
        paths = sorted(Path(directory).glob(f"part-*.{kind}"))
        assert len(paths) == 7, table
        if kind == "csv":
            options = pcsv.ReadOptions(column_names=names)
            pieces = [pcsv.read_csv(p, read_options=options).cast(source.schema) for p in paths]
        else:
            pieces = [pq.read_table(p) for p in paths]
        per = -(-source.num_rows // 7)
        assert [p.num_rows for p in pieces] == [per] * 6 + [source.num_rows - 6 * per], table
        assert pa.concat_tables(pieces).equals(source), table
    # Cached: a second call writes nothing.
    stamp = Path(parts["bid"]) / ".source"
    before = stamp.stat().st_mtime_ns
    assert convert(str(files), 7) == parts and stamp.stat().st_mtime_ns == before


def test_bytewax_partition_resumes_at_its_snapshot_across_row_groups(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": list(range(1000))}), path, row_group_size=128)
    whole = bytewax_nexmark._ParquetPartition(str(path), 50, 0, None)
    assert [r["x"] for r in whole.next_batch()] == list(range(50))
    for position in (0, 37, 128, 300, 999, 1000):
        part = bytewax_nexmark._ParquetPartition(str(path), 50, position, None)
        rows: list[int] = []
        with pytest.raises(StopIteration):
            while True:
                rows.extend(r["x"] for r in part.next_batch())
                assert part.snapshot() == position + len(rows)
        assert rows == list(range(position, 1000)), position


def test_bytewax_partition_writes_every_batch_to_the_probe(tmp_path: Path) -> None:
    import probes
    import rate_probe

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": list(range(300))}), path, row_group_size=100)
    probe = rate_probe.RateProbe(str(tmp_path / "probe"), attempt=1)
    part = bytewax_nexmark._ParquetPartition(str(path), 64, 250, probe)
    part.next_batch()
    probe.close()
    (line,) = probes.read_probe(str(tmp_path / "probe"), "rate")
    assert [n for _, n in line["samples"]] == [14]  # rows 250-263 of the batch 200-263
