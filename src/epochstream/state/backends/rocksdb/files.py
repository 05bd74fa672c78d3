"""The files of a RocksDB snapshot: SST checksums, the meta column family naming each
state's kind and serializer, and reading a snapshot's database offline (savepoints,
the state reader).

Example::

    for row in read_database_rows("/ckpt/job/chk-3/rocks-0", "counts"):
        ...
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Iterator
from typing import Any

import cloudpickle

from epochstream.core.state_ttl import TtlConfig
from epochstream.state.backends.base import ROWS, base_kind
from epochstream.state.backends.rocksdb.states import decode_prefix, key_group_bounds, split_value
from epochstream.state.canonical import CanonicalRow, StateMeta
from epochstream.state.keyformat import decode_key

__all__ = [
    "META_CF",
    "SST_SUFFIX",
    "canonical_rows",
    "crc_file",
    "encode_meta",
    "read_database_rows",
    "read_meta",
]

META_CF = "__epochstream_meta"
SST_SUFFIX = ".sst"


def crc_file(path: str) -> int:
    """The CRC-32 of a local file, read in 1 MiB chunks (checked when it is downloaded).

    Example: ``crc_file("/scratch/rocks-0/000012.sst")``
    """
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def read_meta(meta_cf: Any) -> dict[str, StateMeta]:
    """Kind and serializer of every state of a database (its meta column family)."""
    metas = {}
    for name, raw in list(meta_cf.items()):
        doc = json.loads(raw)
        serializer = cloudpickle.loads(base64.b64decode(doc["serializer"]))
        metas[name.decode("utf-8")] = StateMeta(doc["kind"], serializer)
    return metas


def encode_meta(kind: str, serializer: Any) -> bytes:
    """The meta column family's value for a state."""
    doc = {
        "kind": kind,
        "serializer": base64.b64encode(cloudpickle.dumps(serializer)).decode("ascii"),
    }
    return json.dumps(doc).encode("utf-8")


def read_database_rows(path: str, state_name: str) -> Iterator[tuple[Any, ...]]:
    """Offline: ``(key, value, key group, namespace, user key, ttl)`` of one state of the
    RocksDB database (checkpoint files) at ``path``, opened read-only."""
    import rocksdict

    raw = rocksdict.Options(raw_mode=True)
    names = [n for n in rocksdict.Rdict.list_cf(path) if n != "default"]
    families = {n: rocksdict.Options(raw_mode=True) for n in names}
    access = rocksdict.AccessType.read_only(False)
    db = rocksdict.Rdict(path, raw, column_families=families, access_type=access)
    try:
        meta_cf = db.get_column_family(META_CF)
        meta = read_meta(meta_cf).get(state_name)
        del meta_cf
        if meta is None:
            return
        cf = db.get_column_family(state_name)
        entries: list[Any] = list(cf.items())
        for db_key, stored in entries:
            kg, key, ns, rest = decode_prefix(db_key)
            kind = base_kind(meta.kind)
            if kind in ("list", ROWS) and not rest:
                continue  # the element counter
            data, ts = split_value(stored)
            user_key = decode_key(rest) if kind == "map" else None
            namespace = decode_key(ns) if ns else None
            yield (decode_key(key), meta.serializer.loads(data), kg, namespace, user_key, ts)
        del cf
    finally:
        db.close()


def canonical_rows(
    db: Any, kinds: dict[str, str], ttls: dict[str, TtlConfig | None], kg: int, now: float
) -> list[CanonicalRow]:
    """Every entry of key group ``kg`` in ``db`` as canonical rows (expired ones left out)."""
    import rocksdict

    rows: list[CanonicalRow] = []
    lo, hi = key_group_bounds(kg, kg + 1)
    for name, state_kind in sorted(kinds.items()):
        kind = base_kind(state_kind)
        ttl = ttls.get(name)
        cf = db.get_column_family(name)
        options = rocksdict.ReadOptions()
        options.set_iterate_upper_bound(hi)
        for db_key, stored in cf.items(from_key=lo, read_opt=options):
            _kg, key, ns, rest = decode_prefix(db_key)
            if kind in ("list", ROWS) and not rest:
                continue  # the element counter
            data, ts = split_value(stored)
            if ttl is not None and ts is not None and now - ts >= ttl.seconds:
                continue
            user_key = rest if kind == "map" else None
            rows.append((name, key, ns or None, user_key, data, ts))
        del cf
    return rows
