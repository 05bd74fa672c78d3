"""What a benchmark ran on: one description every harness records with its figures.

Example::

    facts = machine_facts(spark=True)
    print(machine_line(facts))
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
import subprocess
from typing import Any

__all__ = ["int_list", "machine_facts", "machine_line"]

HERE = os.path.dirname(os.path.abspath(__file__))


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _first_line(argv: list[str]) -> str:
    """The first line a command prints (stdout or stderr), or why it could not run."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({exc})"
    text = (done.stdout + done.stderr).strip()
    return text.splitlines()[0] if text else ""


def _git(*argv: str) -> str:
    try:
        done = subprocess.run(
            ["git", *argv], cwd=HERE, capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({exc})"
    return done.stdout.strip()


def machine_facts(*, spark: bool = False) -> dict[str, Any]:
    """Cores, CPU, memory, interpreter and library versions, date, source revision and
    load; with ``spark``, the PySpark and Java versions too."""
    import epochstream

    cpu = ""
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo", encoding="utf-8") as f:
        mem_kb = int(f.readline().split()[1])
    facts: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "rocksdict": _version("rocksdict"),
        "pyarrow": _version("pyarrow"),
        "cloudpickle": _version("cloudpickle"),
        "epochstream": epochstream.__version__,
        "git_head": _git("rev-parse", "HEAD"),
        "git_src_changes": _git("status", "--porcelain", "--", "src").splitlines(),
        "loadavg_start": os.getloadavg(),
    }
    if spark:
        facts["pyspark"] = _version("pyspark")
        facts["java"] = _first_line(["java", "-version"])
    return facts


def machine_line(m: dict[str, Any]) -> str:
    """One sentence naming the machine of a results file (for rendered tables)."""
    spark = f"PySpark {m['pyspark']}, {m.get('java')}, " if "pyspark" in m else ""
    return (
        f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory_gib']} GiB, Python {m['python']}, "
        f"{spark}rocksdict {m.get('rocksdict')}, pyarrow {m.get('pyarrow')}, epochstream "
        f"{m['epochstream']} ({str(m.get('git_head', ''))[:10]}), {m['date']}."
    )


def int_list(text: str) -> list[int]:
    """``"10_000,1_000_000"`` -> ``[10000, 1000000]`` (command-line sizes)."""
    return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]
