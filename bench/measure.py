"""The plumbing of ``bench/all.py``'s measurements: the results document, one
measurement made into a row (its failure kept as the row's error), and series of runs
with checkpoints and without reduced to medians.

Example::

    results = Results("/tmp/out", "all", {"rows": [], "latency": [], "recovery": [], ...})
    measure(results, "rows", {"system": "x"}, lambda: {"rate": 1.0})
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from install import PeerUnavailable
from report import markdown

__all__ = ["DATA_DIR", "Results", "alternating", "measure", "median_of", "nexmark_files"]

DATA_DIR = "/tmp/epochstream-bench"


class Results:
    """The results document, saved (JSON, Markdown) after every measurement."""

    def __init__(self, out_dir: str, name: str, doc: dict[str, Any]) -> None:
        os.makedirs(out_dir, exist_ok=True)
        self.json_path = os.path.join(out_dir, f"{name}.json")
        self.md_path = os.path.join(out_dir, f"{name}.md")
        self.png_path = os.path.join(out_dir, f"{name}.png")
        self.doc = doc

    def add(self, section: str, row: dict[str, Any]) -> None:
        self.doc[section].append(row)
        shown = {k: v for k, v in row.items() if k not in ("rates", "check")}
        print(f"[{section}] {json.dumps(shown, default=str)}", flush=True)
        self.save()

    def save(self) -> None:
        tmp = f"{self.json_path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.doc, f, indent=2, sort_keys=True, default=str)
            f.write("\n")
        os.replace(tmp, self.json_path)
        with open(self.md_path, "w", encoding="utf-8") as f:
            f.write(markdown(self.doc))


def alternating(
    throughput: Callable[[float | None], dict[str, Any]], repeat: int
) -> dict[float | None, list[dict[str, Any] | Exception]]:
    """``repeat`` runs with checkpoints every 1 s and ``repeat`` without, alternating,
    so that a drift of the machine's speed during the series weighs on both alike.
    A run that fails is kept as its exception (``median_of`` raises it)."""
    runs: dict[float | None, list[dict[str, Any] | Exception]] = {1.0: [], None: []}
    for _ in range(repeat):
        for ck, done in runs.items():
            try:
                done.append(throughput(ck))
            except Exception as exc:  # recorded as the row's error by measure
                done.append(exc)
    return runs


def median_of(runs: list[dict[str, Any] | Exception]) -> dict[str, Any]:
    """The median of ``runs`` by rate, with every run's rate in ``rates``; the first
    failed run, if any, is raised."""
    done: list[dict[str, Any]] = []
    for run in runs:
        if isinstance(run, Exception):
            raise run
        done.append(run)
    ordered = sorted(done, key=lambda r: r["rate"])
    out = dict(ordered[(len(ordered) - 1) // 2])
    out["rates"] = [r["rate"] for r in done]
    return out


def measure(
    results: Results,
    section: str,
    base: dict[str, Any],
    fn: Callable[[], dict[str, Any]],
) -> dict[str, Any]:
    """Run one measurement; a failure becomes the row's ``error`` (never dropped)."""
    row = dict(base)
    row["load1_before"] = round(os.getloadavg()[0], 2)
    try:
        row.update(fn())
    except PeerUnavailable as exc:
        row["error"] = f"unavailable: {exc}"
    except Exception as exc:  # recorded in the results and the table
        row["error"] = f"{type(exc).__name__}: {exc}"
    results.add(section, row)
    return row


def nexmark_files(args: Any, *, events: int | None = None) -> str:
    """The Nexmark files of ``events`` events (default ``--nexmark-events``; written
    once, reused)."""
    import nexmark_jobs

    return str(nexmark_jobs.nexmark_files(events or args.nexmark_events, DATA_DIR))
