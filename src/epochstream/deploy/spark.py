"""The Spark runner: every slot is a long-running task of one barrier-mode stage.

The job master submits ``sc.parallelize(range(P), P).barrier().mapPartitions(slot)``
under its own job group; task ``i`` is slot ``i``. Barrier mode makes Spark start
all ``P`` tasks together (gang scheduling) and fail them together. Spark does not
own recovery: on any failure the job master cancels the job group and submits a
new attempt that restores the latest completed checkpoint.

Example::

    runner = SparkRunner(parallelism=2, master="local[2]")
    runner.start(launch, on_exit=print)
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator
from typing import Any

from epochstream.deploy.runners import OnExit, Runner, RunnerLost
from epochstream.exceptions import ConfigurationError
from epochstream.runtime.slot import SlotLaunch, run_slot

__all__ = ["SparkRunner", "create_session"]

log = logging.getLogger(__name__)

_LOOPBACK = re.compile(r"^(local(\[.*\])?|spark://(127\.\d+\.\d+\.\d+|localhost)(:\d+)?)$")


def create_session(master: str, *, app_name: str = "epochstream") -> Any:
    """A SparkSession configured for long-running slot tasks.

    Python workers are not reused (a slot's process ends with its task) but forked
    from a daemon that has epochstream imported (``epochstream.deploy.daemon``), the UI
    is off, and for local or loopback masters the driver binds to 127.0.0.1 so every
    plane stays on loopback. If a session is already active in this process it is
    returned as it is (Spark allows one per process).

    Example: ``spark = create_session("local[2]")``
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    existed = SparkContext._active_spark_context is not None
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.worker.reuse", "false")
        .config("spark.python.daemon.module", "epochstream.deploy.daemon")
        .config("spark.pyspark.python", sys.executable)
    )
    if _LOOPBACK.match(master):
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    spark = builder.getOrCreate()
    if not existed:
        spark.sparkContext.setLogLevel("ERROR")
        _OWNED.append(spark)
    return spark


# Sessions epochstream created itself (not handed in by the user): one of these may be
# replaced when a later job needs more local task slots than it offers.
_OWNED: list[Any] = []


def _spark_slot(launch: SlotLaunch, _partition: Iterator[Any]) -> Iterator[int]:
    """Runs inside the Spark task (Python worker): become slot ``partitionId``."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    index = ctx.partitionId()
    address = ctx.getTaskInfos()[index].address
    host = address.rsplit(":", 1)[0] if ":" in address else address
    run_slot(launch, index=index, host=host or "127.0.0.1")
    yield index


class SparkRunner(Runner):
    """Runs slots as Spark barrier tasks on ``spark`` or a session for ``master``."""

    def __init__(self, *, parallelism: int, master: str | None = None, spark: Any = None) -> None:
        self.parallelism = parallelism
        if spark is None:
            spark = self._session_for(master or f"local[{parallelism}]", parallelism)
        self.spark = spark
        self.sc = spark.sparkContext
        self._thread: threading.Thread | None = None
        self._group: str | None = None
        slots = self.sc.defaultParallelism
        if self.sc.master.startswith("local") and slots < parallelism:
            raise ConfigurationError(
                f"Spark master {self.sc.master} offers {slots} task slots but the job needs "
                f"{parallelism} (one long-running barrier task per slot): use local[{parallelism}]"
            )

    @staticmethod
    def _session_for(master: str, parallelism: int) -> Any:
        spark = create_session(master)
        sc = spark.sparkContext
        too_small = sc.master.startswith("local") and sc.defaultParallelism < parallelism
        if too_small and any(s is spark for s in _OWNED) and master.startswith("local"):
            log.warning(
                "replacing epochstream's Spark session %s (%d slots) with %s for a job of "
                "parallelism %d",
                sc.master,
                sc.defaultParallelism,
                master,
                parallelism,
            )
            _OWNED.remove(spark)
            spark.stop()
            spark = create_session(master)
        return spark

    def control_host(self) -> str:
        return str(self.sc.getConf().get("spark.driver.host", "127.0.0.1"))

    def start(self, launch: SlotLaunch, on_exit: OnExit) -> None:
        group = f"epochstream-{launch.job_id}-{launch.attempt}"
        self._group = group
        p = self.parallelism
        sc = self.sc

        def submit() -> None:
            error: BaseException | None = None
            try:
                sc.setJobGroup(
                    group,
                    f"epochstream {launch.job_id} attempt {launch.attempt}",
                    interruptOnCancel=True,
                )
                rdd = sc.parallelize(range(p), p).barrier()
                slots = rdd.mapPartitions(functools.partial(_spark_slot, launch))
                self._pin_interpreter(slots)
                slots.collect()
            except Exception as exc:  # handed to the job master, which decides what it means
                error = exc
            on_exit(error)

        self._thread = threading.Thread(target=submit, name=f"spark-{group}", daemon=True)
        self._thread.start()

    def _pin_interpreter(self, rdd: Any) -> None:
        """Run the slot tasks with this driver's interpreter when Spark runs locally.

        A session created elsewhere may point its workers at another ``python3`` that
        lacks epochstream (or has another version of it). Locally the driver's own
        interpreter is the right one, so it is used for this RDD only: PySpark reads
        ``pythonExec`` when the RDD's Java side is built, and the setting is put back.
        """
        sc = self.sc
        if not sc.master.startswith("local") or sc.pythonExec == sys.executable:
            return
        log.info("running slot tasks with %s instead of %s", sys.executable, sc.pythonExec)
        saved = sc.pythonExec
        sc.pythonExec = sys.executable
        try:
            rdd._jrdd  # noqa: B018 - builds the PythonFunction, capturing pythonExec now
        finally:
            sc.pythonExec = saved

    def describe_exit_error(self, error: BaseException) -> tuple[str, bool]:
        """The Spark job's failure as text, and whether restarting is pointless."""
        text = repr(error)
        java = getattr(error, "java_exception", None)
        if java is not None:
            try:
                text = str(java.getMessage())
            except Exception as exc:  # the gateway may be gone: keep the Python repr
                log.debug("cannot read the Java exception: %r", exc)
        if "No module named 'epochstream'" in text:
            return (
                "Spark's Python workers cannot import epochstream: install it in the "
                "interpreter Spark uses (PYSPARK_PYTHON / spark.pyspark.python, now "
                f"{self.sc.pythonExec!r}); this driver runs {sys.executable}",
                True,
            )
        return _trim(text), False

    def cancel(self) -> None:
        if self._group is None:
            return
        try:
            self.sc.cancelJobGroup(self._group)
        except Exception as exc:
            if self._jvm_alive():
                raise
            raise RunnerLost(
                f"the Spark context was lost: its JVM does not answer ({type(exc).__name__}: {exc})"
            ) from exc

    def _jvm_alive(self) -> bool:
        try:
            self.sc._jvm.java.lang.System.currentTimeMillis()
        except Exception as exc:  # any py4j failure here means the gateway is gone
            log.debug("Spark JVM does not answer: %r", exc)
            return False
        return True

    def wait(self, timeout: float) -> bool:
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()


def _trim(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more chars)"
