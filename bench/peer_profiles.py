"""What ``bench/all.py`` knows about each peer beyond how to start it: the tuning its
own benchmark suite or documentation gives (run beside its defaults, the better figure
quoted) and the handicap it carries here that the harness cannot remove (printed
beside its figures).

A tuning is a list of settings handed to the peer's script as ``--set KEY=VALUE``; the
script applies them over its own configuration. Only settings a peer's maintainers
publish count, so that "the peer at its best" means their best, not ours.

Example::

    for tuning, argv in variants("pyflink"):     # ("untuned", []), ("tuned: ...", [...])
        run(script, [*base_argv, *argv])
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PROFILES", "UNTUNED", "PeerProfile", "Tuning", "variants"]

#: The name of a peer's run with its script's own settings.
UNTUNED = "untuned"


@dataclass(frozen=True)
class Tuning:
    """Settings a peer's maintainers publish for speed, and where.

    Example: ``Tuning("nexmark config.yaml", "github.com/...", (("k", "v"),))``
    """

    name: str
    source: str
    settings: tuple[tuple[str, str], ...]

    def describe(self) -> dict[str, object]:
        """The tuning as the results document records it."""
        return {"name": self.name, "source": self.source, "settings": dict(self.settings)}

    def argv(self) -> list[str]:
        """The settings as the peer script's ``--set KEY=VALUE`` arguments."""
        return [arg for key, value in self.settings for arg in ("--set", f"{key}={value}")]


@dataclass(frozen=True)
class PeerProfile:
    """A peer's handicap here, its published tuning (if any), and the tuning every run
    of it already has (its script sets it; named so that the report says so)."""

    handicap: str
    tuning: Tuning | None = None
    always: str = ""


# Flink's own Nexmark benchmark runs every query with these (nexmark/nexmark,
# nexmark-flink/src/main/resources/conf/config.yaml and config_v2.yaml, identical in
# both). Mini-batches buffer input for up to 2 s or 50,000 records before an
# aggregation reads its state; the split turns a COUNT(DISTINCT) into a two-level
# aggregation so that a hot key spreads over subtasks.
FLINK_NEXMARK = Tuning(
    name="Flink's Nexmark settings",
    source="github.com/nexmark/nexmark nexmark-flink/src/main/resources/conf/config.yaml",
    settings=(
        ("table.exec.mini-batch.enabled", "true"),
        ("table.exec.mini-batch.allow-latency", "2s"),
        ("table.exec.mini-batch.size", "50000"),
        ("table.optimizer.distinct-agg.split.enabled", "true"),
    ),
)

# The Kafka pipeline's peers (bench/kafka_pipeline.py). Quix documents its Kafka
# clients' settings as the place to tune (consumer_extra_config/producer_extra_config,
# librdkafka's batching); Bytewax's KafkaSource documents batch_size.
QUIX_BATCHING = Tuning(
    name="librdkafka batching",
    source="quix.io/docs Configuration (consumer_extra_config, producer_extra_config); "
    "librdkafka CONFIGURATION.md",
    settings=(
        ("producer.linger.ms", "20"),
        ("producer.batch.num.messages", "10000"),
        ("consumer.fetch.min.bytes", "65536"),
        ("consumer.fetch.wait.max.ms", "50"),
    ),
)
BYTEWAX_KAFKA_BATCHES = Tuning(
    name="KafkaSource batch_size",
    source="bytewax.connectors.kafka.KafkaSource docstring (batch_size); librdkafka "
    "CONFIGURATION.md",
    settings=(
        ("batch_size", "10000"),
        ("producer.linger.ms", "5"),
        ("producer.batch.num.messages", "10000"),
    ),
)

PROFILES: dict[str, PeerProfile] = {
    # The wheel on PyPI bundles no Parquet format (flink-sql-parquet is on Maven only):
    # Flink parses text where the others read Parquet.
    "pyflink": PeerProfile(
        handicap="reads CSV (the PyFlink wheel has no Parquet format)", tuning=FLINK_NEXMARK
    ),
    # Every micro-batch is planned, scheduled and committed before the next one starts;
    # continuous mode, the alternative, has no aggregations.
    "spark-ss": PeerProfile(
        handicap="micro-batches (each committed to the checkpoint location; no "
        "checkpoints-off run)",
        # Spark's default of 200 would be 100 tasks per core per micro-batch here; its SQL
        # performance-tuning guide names this setting as the one that sizes the shuffles
        # of joins and aggregations, so no run goes without it.
        always="spark.sql.shuffle.partitions = parallelism",
    ),
    # Workers of one process share the GIL; more processes need a cluster launch that
    # this single-process harness does not make.
    "bytewax": PeerProfile(handicap="1 worker (one Python process, the GIL); string keys"),
    "quixstreams": PeerProfile(
        handicap="none known: exactly-once like epochstream",
        tuning=QUIX_BATCHING,
        always="commit_interval = 1 s (the checkpoint interval); one process per unit of "
        "parallelism, one consumer group",
    ),
    # Its sink flushes every batch but is not transactional: a restart replays outputs.
    "bytewax-kafka": PeerProfile(
        handicap="at-least-once: no transactional Kafka sink (an easier job than exactly-once)",
        tuning=BYTEWAX_KAFKA_BATCHES,
        always="epoch (snapshot) interval = 1 s into SQLite recovery partitions; one "
        "process per unit of parallelism (a Bytewax cluster, -i/-a)",
    ),
}


def variants(system: str) -> list[tuple[str, list[str]]]:
    """The runs of ``system`` per setting, untuned first then tuned (alternating when the
    caller loops over settings outside): ``(tuning name, extra script arguments)``.

    Example: ``variants("bytewax") == [("untuned", [])]``
    """
    profile = PROFILES.get(system)
    runs: list[tuple[str, list[str]]] = [(UNTUNED, [])]
    if profile is not None and profile.tuning is not None:
        runs.append((f"tuned: {profile.tuning.name}", profile.tuning.argv()))
    return runs
