"""Sinks (the ``es.sinks`` namespace).

- :class:`FileSink`: two-phase commit; committed JSON-lines, CSV or Parquet files
  appear only when the checkpoint that covers them completes (exactly-once with
  checkpointing on); :class:`RollingPolicy` rolls row formats by records, bytes, age.
- :class:`PostgresSink`: two-phase commit (``PREPARE TRANSACTION``), exactly-once; or
  idempotent upserts (``ON CONFLICT``).
- :class:`DeltaSink`: one Delta transaction per checkpoint through a global committer,
  with an application transaction id so a replayed commit is skipped: exactly-once.
- :class:`JetStreamSink`: write-ahead, published after the checkpoint completes with
  deterministic message ids: exactly-once within the stream's duplicate window.
- :class:`KafkaSink`: Kafka transactions committed when the checkpoint completes
  (exactly-once for ``read_committed`` consumers), or at-least-once, or none.
- :class:`PrintSink`: stdout, at-least-once.
- :class:`DiscardSink`: drops records (benchmarks).
- :class:`TwoPhaseCommitSinkWriter`: base for your own transactional sinks.

Each of them takes rows or Arrow record batches: a columnar stream goes in without
``to_rows()`` (docs/connectors.md says what each writes of a batch).

Example::

    ds.sink_to(es.sinks.FileSink("out/", format="jsonl"))
"""

from epochstream.connectors.base import AtLeastOnceSinkWriter, Sink, SinkContext, SinkWriter
from epochstream.connectors.delta import DeltaSink
from epochstream.connectors.filesink import FileSink, RollingPolicy
from epochstream.connectors.jetstream import JetStreamSink
from epochstream.connectors.kafka.sink import KafkaSink
from epochstream.connectors.postgres import PostgresSink
from epochstream.connectors.simple import DiscardSink, PrintSink
from epochstream.connectors.twophase import TwoPhaseCommitSinkWriter, TxnState

__all__ = [
    "AtLeastOnceSinkWriter",
    "DeltaSink",
    "DiscardSink",
    "FileSink",
    "JetStreamSink",
    "KafkaSink",
    "PostgresSink",
    "PrintSink",
    "RollingPolicy",
    "Sink",
    "SinkContext",
    "SinkWriter",
    "TwoPhaseCommitSinkWriter",
    "TxnState",
]
