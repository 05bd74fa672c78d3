"""How a batch or in-band event becomes the bytes of one frame, and back.

One encoding for everything that carries batches as bytes: network channels, and the
channel state of unaligned checkpoints (the in-flight frames a checkpoint keeps). A row
batch or event is a pickle (protocol 5); a columnar batch is an Arrow IPC stream; the
two are told apart by their first bytes.

Example::

    encoder = FrameEncoder("map -> sum (hash)")
    payload = encoder.encode(RowBatch([1, 2, 3]))
    decode_frame(payload, pickle.loads).records      # [1, 2, 3]
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import cloudpickle
from pyarrow import RecordBatch

from epochstream.core.arrow import decode_ipc, encode_ipc, is_ipc_frame
from epochstream.exceptions import SerializationError, short_repr
from epochstream.runtime.batches import RowBatch

__all__ = ["FrameEncoder", "decode_frame"]


class FrameEncoder:
    """Encodes the items of one edge.

    Plain pickle first; a batch plain pickle refuses (an instance of a class defined in
    the job script, which slots know only by value) is pickled with cloudpickle instead,
    and the encoder keeps using cloudpickle from then on. A record neither can pickle
    raises :class:`SerializationError` naming the record and the edge.

    Example: ``FrameEncoder("src -> sink (forward)").encode(END_OF_INPUT)``
    """

    __slots__ = ("_dumps", "edge")

    def __init__(self, edge: str = "") -> None:
        self.edge = edge
        self._dumps: Callable[..., bytes] = pickle.dumps

    def encode(self, item: Any) -> bytes:
        """The frame payload of ``item``."""
        if type(item) is RecordBatch:
            return encode_ipc(item)
        try:
            return self._dumps(item, protocol=5)
        except Exception:  # plain pickle refused: try by-value pickling, then name the record
            return self._by_value(item)

    def _by_value(self, item: Any) -> bytes:
        try:
            data: bytes = cloudpickle.dumps(item, protocol=5)
        except Exception as exc:
            raise _serialization_error(item, self.edge, exc) from exc
        self._dumps = cloudpickle.dumps
        return data


def decode_frame(payload: bytes, unpickle: Callable[[bytes], Any]) -> Any:
    """The item of a frame payload: a columnar batch, or what ``unpickle`` makes of it.

    Example: ``decode_frame(payload, conn.unpickle)``
    """
    return decode_ipc(payload) if is_ipc_frame(payload) else unpickle(payload)


def _serialization_error(item: Any, edge: str, exc: Exception) -> Exception:
    """Find the record of a batch that does not pickle and name it with the edge."""
    if type(item) is not RowBatch:
        return exc
    item = item.records
    for index, record in enumerate(item):
        try:
            cloudpickle.dumps(record, protocol=5)
        except Exception as record_exc:
            return SerializationError(
                f"record {short_repr(record)} (type {type(record).__qualname__}, position "
                f"{index} of its batch) cannot cross edge {edge} to another slot: "
                f"{type(record_exc).__name__}: {record_exc}. Records moving between slots are "
                "pickled; keep them to picklable values (no open files, sockets, locks, "
                "generators)"
            )
    return exc
