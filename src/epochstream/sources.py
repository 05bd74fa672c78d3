"""Sources (the ``es.sources`` namespace): split-based and re-settable.

``es.sources.kafka`` and ``es.sources.nexmark`` hold each system's helpers
(``es.sources.nexmark.NexmarkConfig``, ``es.sources.nexmark.write_nexmark_files``).

Example::

    env.from_source(es.sources.SequenceSource(0, 1000, rate=100.0))
"""

from epochstream.connectors import kafka, nexmark
from epochstream.connectors.base import Source, SourceContext, SourceReader
from epochstream.connectors.enumerators import SplitEnumerator
from epochstream.connectors.formats import FileSource, TextFileSource
from epochstream.connectors.generators import CollectionSource, SequenceSource
from epochstream.connectors.jetstream import JetStreamSource
from epochstream.connectors.kafka import KafkaSource
from epochstream.connectors.nexmark import NexmarkSource
from epochstream.connectors.socket import SocketTextSource

__all__ = [
    "CollectionSource",
    "FileSource",
    "JetStreamSource",
    "KafkaSource",
    "NexmarkSource",
    "SequenceSource",
    "SocketTextSource",
    "Source",
    "SourceContext",
    "SourceReader",
    "SplitEnumerator",
    "TextFileSource",
    "kafka",
    "nexmark",
]
