"""A corrupt newest checkpoint makes recovery fall back to the previous one, and says so;
a corrupt older checkpoint never blocks restoring the newest."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import epochstream as es

pytestmark = [pytest.mark.slow, pytest.mark.spark]

N = 40_000
KEYS = 11


def _pipeline(env: es.Environment, out: Path) -> None:
    (
        env.from_sequence(0, N, rate=8_000)
        .uid("numbers")
        .map(lambda i: (i % KEYS, 1))
        .key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]))
        .uid("counts")
        .sink_to(es.sinks.FileSink(str(out)))
        .uid("files")
    )


def _finals(rows: list[list[int]]) -> dict[int, int]:
    finals: dict[int, int] = {}
    for key, count in rows:
        finals[key] = max(finals.get(key, 0), count)
    return finals


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for i in range(min(len(data), 64)):
        data[-1 - i] ^= 0xFF
    path.write_bytes(bytes(data))


def _damage_newest_and_recover(
    spark: Any, tmp_path: Path, caplog: Any, pipeline: Any, state_glob: str, damage: Any
) -> tuple[es.JobResult, list[list[int]]]:
    """Run ``pipeline`` until its second checkpoint, ``damage`` the first of that
    checkpoint's files matching ``state_glob``, kill slot 0; the job must fall back to
    the checkpoint before. The result and the committed rows."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    env = es.Environment(parallelism=2, spark=spark)
    # Full heap snapshots: each checkpoint's keyed state is its own file in its directory.
    env.set_state_backend(es.state.HeapStateBackend(incremental=False))
    env.enable_checkpointing(2.0, storage=str(ckpt), retained=2)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    pipeline(env, out)
    client = env.execute_async("counts")
    newest = client.wait_for_checkpoint(2)
    state_files = sorted((ckpt / client.job_id / f"chk-{newest}").glob(state_glob))
    assert state_files, f"the newest checkpoint holds {state_glob} files"
    damage(state_files[0])
    with caplog.at_level(logging.WARNING):
        es.testing.kill_slot(client, 0)
        result = client.result(timeout=240)
    assert f"checkpoint {newest} cannot be restored" in caplog.text
    assert f"falling back to checkpoint {newest - 1}" in caplog.text
    assert result.restarts == 2, result.failures  # the crash, then the damaged restore
    return result, es.testing.read_committed(out)


def test_corrupt_newest_checkpoint_falls_back(spark: Any, tmp_path: Path, caplog) -> None:
    result, rows = _damage_newest_and_recover(
        spark, tmp_path, caplog, _pipeline, "counts-*.kst", _corrupt
    )
    assert "checksum mismatch" in result.failures[1]
    # State rolled back consistently: every key ends at its true count. Output committed
    # after the older checkpoint may appear twice (the warning says so), none is lost.
    assert _finals(rows) == {k: len(range(k, N, KEYS)) for k in range(KEYS)}
    seen = {(k, c) for k, c in rows}
    assert all((k, c) in seen for k in range(KEYS) for c in range(1, len(range(k, N, KEYS)) + 1))


def test_corrupt_older_checkpoint_does_not_block_resuming_the_newest(
    spark: Any, tmp_path: Path
) -> None:
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.3, storage=str(ckpt), retained=3, retain_on_cancel=True)
    _pipeline(env, out)
    client = env.execute_async("counts")
    client.wait_for_checkpoint(4)
    client.cancel()
    with pytest.raises(es.JobCancelled):
        client.result(timeout=60)
    job_dir = ckpt / client.job_id
    completed = sorted(
        (p for p in job_dir.glob("chk-*") if (p / "_metadata").exists()),
        key=lambda p: int(p.name[4:]),
    )
    assert len(completed) == 3
    (completed[0] / "_metadata").write_text("{ not json")
    again = es.Environment(parallelism=3, spark=spark)
    again.enable_checkpointing(0.3, storage=str(ckpt))
    _pipeline(again, out)
    result = again.execute("counts", restore_from=str(job_dir))
    assert result.restored_from == str(completed[-1])
    rows = es.testing.read_committed(out)
    assert _finals(rows) == {k: len(range(k, N, KEYS)) for k in range(KEYS)}
    assert len(rows) == len({(k, c) for k, c in rows}), "exactly once across both jobs"
    listing = subprocess.run(
        [sys.executable, "-m", "epochstream.cli", "checkpoints", str(job_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listing.returncode == 1 and "UNREADABLE" in listing.stdout
    assert "Traceback" not in listing.stderr


def _columnar_pipeline(env: es.Environment, out: Path) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc

    (
        env.from_sequence(0, N, rate=8_000, batch_size=500)
        .uid("numbers")
        .map_batches(lambda b: pa.record_batch([pc.remainder(b["value"], KEYS)], names=["k"]))
        .key_by("k")
        .count()
        .uid("counts")
        .to_rows()
        .map(lambda r: (r["k"], r["count"]))
        .sink_to(es.sinks.FileSink(str(out)))
        .uid("files")
    )


def _tamper(path: Path) -> None:
    """Rewrite the columnar state file well-formed, one count 1000 higher: only the
    checksum can tell."""
    import pyarrow as pa
    import pyarrow.compute as pc

    reader = pa.ipc.open_file(pa.py_buffer(path.read_bytes()))
    batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
    first = batches[0]
    index = first.schema.get_field_index("acc")
    batches[0] = first.set_column(index, "acc", pc.add(first.column(index), 1000))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, reader.schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    path.write_bytes(sink.getvalue().to_pybytes())


@pytest.mark.parametrize("damage", ["corrupt", "tamper", "delete"])
def test_columnar_state_of_the_newest_checkpoint_damaged_falls_back(
    spark: Any, tmp_path: Path, caplog, damage: str
) -> None:
    """A damaged columnar state file failed every restart with a StateError (or, changed
    but well-formed, was restored silently into wrong counts)."""
    damages = {"corrupt": _corrupt, "tamper": _tamper, "delete": Path.unlink}
    _, rows = _damage_newest_and_recover(
        spark, tmp_path, caplog, _columnar_pipeline, "counts-*.columnar.arrow", damages[damage]
    )
    assert _finals(rows) == {k: len(range(k, N, KEYS)) for k in range(KEYS)}
