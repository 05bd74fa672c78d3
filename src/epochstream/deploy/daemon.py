"""PySpark's Python worker daemon, with epochstream imported before it forks workers.

Spark starts one daemon per executor (``python -m <spark.python.daemon.module>``) and
forks a worker from it for every Python task. A slot is such a task, and its process
ends with it (``spark.python.worker.reuse`` is off), so without this every slot of every
job and attempt imported epochstream, NumPy and pyarrow again: 0.2-0.4 s of CPU per
slot, most of a short job's start and of the time to redeploy a killed slot. Imported
here once, the forked workers share the modules copy-on-write.

The modules are imported before the fork although pyspark's own daemon imports its
worker after it, to be safe with any library: here the only threads are native ones,
NumPy's OpenBLAS pool and pyarrow's ``jemalloc_bg_thd``, started at import and idle,
and both libraries restore their state in a forked child (``pthread_atfork``
handlers). No Python thread runs in the daemon, and the module-level locks epochstream
creates at import are never held there, so a child never inherits a taken lock.

``create_session`` sets ``spark.python.daemon.module`` to this module; a session made
elsewhere can do the same (epochstream must be installed on every executor, as for any
job).

Example::

    SparkSession.builder.config("spark.python.daemon.module", "epochstream.deploy.daemon")
"""

from __future__ import annotations

import pyspark.daemon

import epochstream.runtime.slot  # noqa: F401  (imported for the forked workers)

__all__: list[str] = []

if __name__ == "__main__":
    pyspark.daemon.manager()
