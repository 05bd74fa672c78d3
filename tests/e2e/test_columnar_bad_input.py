"""Bad input on the columnar path, end to end (local runner): a batch function that turns
bad after a while. The job fails at once (no restart: retrying meets the same data) with
an error naming the operator and the column, and the output committed before the bad
batch stays committed and correct."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import epochstream as es

N = 6_000
BAD_FROM = 4_500  # the rate lets checkpoints commit the earlier values first
KEYS = 10


def _good(v: pa.ChunkedArray | pa.Array) -> pa.RecordBatch:
    return pa.record_batch([pc.remainder(v, KEYS), pc.add(v, 1)], names=["k", "v"])


def _value_turns_float(v: Any) -> Any:
    return pa.record_batch([pc.remainder(v, KEYS), pc.cast(v, pa.float64())], names=["k", "v"])


def _key_turns_string(v: Any) -> Any:
    return pa.record_batch(
        [pc.cast(pc.remainder(v, KEYS), pa.string()), pc.add(v, 1)], names=["k", "v"]
    )


def _value_column_goes(v: Any) -> Any:
    return pa.record_batch([pc.remainder(v, KEYS)], names=["k"])


def _key_becomes_a_list(v: Any) -> Any:
    keys = pa.ListArray.from_arrays(pa.array(range(len(v) + 1), pa.int32()), pc.remainder(v, KEYS))
    return pa.record_batch([keys, pc.add(v, 1)], names=["k", "v"])


def _not_a_batch(v: Any) -> Any:
    return v.to_pylist()


# A schema change is caught by the operator, or before it by the edge when the changed
# batch meets earlier ones in its send buffer; both name the operator.
_EDGE = r"edge kv -> sum\(v\) .*batches of one stream must share a schema"
CASES = {
    "value-type": (
        _value_turns_float,
        rf"{_EDGE}|sum\(v\) \(\d/2\): column 'v' changed type from int64 to double",
    ),
    "key-type": (
        _key_turns_string,
        rf"{_EDGE}|sum\(v\) \(\d/2\): key column 'k' changed type from int64 to string",
    ),
    "missing-column": (
        _value_column_goes,
        rf"{_EDGE}|sum\(v\) \(\d/2\): the batch has no column 'v'",
    ),
    "nested-key": (_key_becomes_a_list, r"key_by\('k'\): column 'k' is list<"),
    "not-a-batch": (
        _not_a_batch,
        r"map_batches\(batches\) \(\d/2\): map_batches function returned list",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_bad_batches_fail_once_naming_the_operator_and_keep_committed_output(
    case: str, tmp_path: Path
) -> None:
    turn_bad, message = CASES[case]

    def batches(b: pa.RecordBatch) -> Any:
        v = b["value"]
        return turn_bad(v) if pc.max(v).as_py() >= BAD_FROM else _good(v)

    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.1, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.1))
    (
        env.from_sequence(0, N, batch_size=100, rate=4_000)
        .uid("numbers")
        .map_batches(batches)
        .uid("kv")
        .key_by("k")
        .sum("v")
        .uid("sums")
        .to_rows()
        .sink_to(es.sinks.FileSink(str(tmp_path / "out")))
        .uid("files")
    )
    with pytest.raises(es.JobExecutionError, match=message) as failed:
        env.execute(f"bad-{case}")
    assert failed.value.restarts == 0, failed.value.history
    committed = es.testing.read_committed(tmp_path / "out")
    assert committed, "nothing was committed before the bad batch"
    # The committed running sums are distinct (each committed once) and come from good
    # rows only: no sum exceeds the key's total over the values before BAD_FROM.
    good_total = {k: sum(v + 1 for v in range(k, BAD_FROM, KEYS)) for k in range(KEYS)}
    sums = [(r["k"], r["v"]) for r in committed]
    assert len(set(sums)) == len(sums)
    assert [(k, v) for k, v in sums if not 0 < v <= good_total[k]] == []
