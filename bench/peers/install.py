"""Lazy, isolated installation of the peer systems and the commands that run them.

Peers live in their own virtualenvs under ``/tmp/bench-venvs/`` (override with
``EPOCHSTREAM_BENCH_VENVS``), so the project's ``.venv`` never gets their
dependencies. A venv is built on first use only and marked with a stamp file naming
the pinned requirement; nothing here runs from the test suite. The Structured
Streaming peer and the dict loop run on the project's own interpreter.

Example::

    peer = PEERS["bytewax"]
    python = peer.ensure()                 # creates the venv on first use
    cmd = peer.command(python, "B", ["--n", "1000000"])
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field

__all__ = ["PEERS", "Peer", "PeerUnavailable", "java_home", "venv_root"]

HERE = os.path.dirname(os.path.abspath(__file__))
INSTALL_TIMEOUT_S = 300.0


class PeerUnavailable(RuntimeError):
    """A peer cannot run on this machine; the message says why (shown in the results)."""


def venv_root() -> str:
    """Where peer virtualenvs (and the peers' logs) live, created on first use.

    Example: ``venv_root() == "/tmp/bench-venvs"``
    """
    root = os.environ.get("EPOCHSTREAM_BENCH_VENVS", "/tmp/bench-venvs")
    os.makedirs(root, exist_ok=True)
    return root


def java_home() -> str | None:
    """``JAVA_HOME``, or the JDK that the ``java`` on ``PATH`` belongs to.

    Example: ``java_home() == "/usr/lib/jvm/java-17-openjdk-amd64"``
    """
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    java = shutil.which("java")
    if java is None:
        return None
    return os.path.dirname(os.path.dirname(os.path.realpath(java)))


@dataclass
class Peer:
    """One peer system: how to install it and how to start its job script.

    ``requirement`` holds the pip requirements (space-separated) installed into
    ``venv_root()/<name>``; an empty one means the project's interpreter runs the script.

    Example::

        Peer("bytewax", "bytewax_job.py", requirement="bytewax==0.21.1")
    """

    name: str
    script: str
    requirement: str = ""
    import_name: str = ""
    needs_java: bool = False
    install_seconds: float | None = field(default=None, init=False)

    @property
    def venv(self) -> str:
        return os.path.join(venv_root(), self.name)

    def ensure(self) -> str:
        """The interpreter that runs this peer, installing its venv on first use.

        Raises :class:`PeerUnavailable` with the reason when it cannot be set up.
        """
        if self.needs_java and java_home() is None:
            raise PeerUnavailable(f"{self.name} needs Java (none on PATH, JAVA_HOME unset)")
        if not self.requirement:
            return sys.executable
        python = os.path.join(self.venv, "bin", "python")
        stamp = os.path.join(self.venv, ".bench-installed")
        if os.path.exists(stamp):
            with open(stamp, encoding="utf-8") as f:
                if f.read().strip() == self.requirement:
                    return python
        self._install(python, stamp)
        return python

    def _install(self, python: str, stamp: str) -> None:
        start = time.monotonic()
        base = shutil.which("python3.11") or sys.executable
        log_path = os.path.join(venv_root(), f"{self.name}-install.log")
        os.makedirs(venv_root(), exist_ok=True)
        with open(log_path, "w", encoding="utf-8") as log:
            steps = [
                [base, "-m", "venv", "--clear", self.venv],
                [python, "-m", "pip", "install", "--quiet", *self.requirement.split()],
                [python, "-c", f"import {self.import_name or self.name}"],
            ]
            for step in steps:
                remaining = INSTALL_TIMEOUT_S - (time.monotonic() - start)
                try:
                    done = subprocess.run(
                        step,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        timeout=max(remaining, 1.0),
                        check=False,
                    )
                except subprocess.TimeoutExpired as exc:
                    raise PeerUnavailable(
                        f"installing {self.requirement} took over {INSTALL_TIMEOUT_S:.0f} s "
                        f"(log: {log_path})"
                    ) from exc
                if done.returncode != 0:
                    raise PeerUnavailable(
                        f"installing {self.requirement} failed at `{' '.join(step)}` "
                        f"(exit {done.returncode}; log: {log_path})"
                    )
        self.install_seconds = time.monotonic() - start
        with open(stamp, "w", encoding="utf-8") as f:
            f.write(self.requirement + "\n")

    def command(self, python: str, workload: str, args: list[str]) -> list[str]:
        """The argv that runs ``workload`` on this peer. Example: ``peer.command(py, "B", [])``."""
        return [python, os.path.join(HERE, self.script), workload, *args]

    def environment(self) -> dict[str, str]:
        """Environment for the peer's process (Java home, the venv's packages for pemja)."""
        env = dict(os.environ)
        home = java_home()
        if self.needs_java and home is not None:
            env["JAVA_HOME"] = home
        if self.requirement:
            # PyFlink's thread mode embeds CPython in the JVM (pemja); that interpreter
            # does not know about the venv unless its site-packages is on PYTHONPATH.
            site = os.path.join(
                self.venv,
                "lib",
                f"python{sys.version_info.major}.{sys.version_info.minor}",
                "site-packages",
            )
            env["PYTHONPATH"] = site
        return env


PEERS: dict[str, Peer] = {
    "dictloop": Peer("dictloop", "dictloop_job.py"),
    # pyarrow: the Nexmark peer reads the Parquet files itself.
    "bytewax": Peer("bytewax", "bytewax_job.py", requirement="bytewax==0.21.1 pyarrow>=15"),
    # The Kafka pipeline (bench/kafka_pipeline.py): Bytewax's own Kafka connector needs
    # confluent-kafka; Quix Streams brings its own.
    "bytewax-kafka": Peer(
        "bytewax-kafka",
        "bytewax_kafka_job.py",
        requirement="bytewax==0.21.1 confluent-kafka==2.16.0",
        import_name="bytewax.connectors.kafka",
    ),
    "quixstreams": Peer("quixstreams", "quix_kafka_job.py", requirement="quixstreams==3.28.1"),
    "spark-ss": Peer("spark-ss", "spark_ss_job.py", needs_java=True),
    # Not a peer: bench/all.py draws its PNG there, keeping matplotlib out of .venv.
    "plot": Peer(
        "plot", "plot_results.py", requirement="matplotlib>=3.8", import_name="matplotlib"
    ),
    "pyflink": Peer(
        "pyflink",
        "pyflink_job.py",
        requirement="apache-flink==2.3.0",
        import_name="pyflink",
        needs_java=True,
    ),
}
