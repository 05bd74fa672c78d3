"""Draw a results file of ``bench/all.py`` as a PNG: events/s per workload and system.

Runs in the plot venv (``/tmp/bench-venvs/plot``, matplotlib), started by
``bench/all.py``; reads the JSON, writes the PNG, prints one JSON line. One panel
per checkpoint setting (on: 1 s or Spark's micro-batches; off), bars grouped by
workload, one colour per system, log scale; a failed or missing figure has no bar.

Example::

    /tmp/bench-venvs/plot/bin/python bench/peers/plot_results.py bench/results/all.json out.png
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from report import summary_rows


def main() -> None:
    src, png = sys.argv[1], sys.argv[2]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    with open(src, encoding="utf-8") as f:
        doc = json.load(f)
    rows = summary_rows(doc)
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    systems = list(dict.fromkeys(r["system"] for r in rows))
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 1.3 * len(workloads) + 4), 9), sharex=True)
    width = 0.8 / max(1, len(systems))
    colours = plt.get_cmap("tab10")
    for ax, (field, title) in zip(
        axes,
        (
            ("rate_on", "checkpoints on (1 s; Spark: micro-batches)"),
            ("rate_off", "checkpoints off"),
        ),
        strict=True,
    ):
        for si, system in enumerate(systems):
            xs, ys = [], []
            for wi, workload in enumerate(workloads):
                r = next(
                    (r for r in rows if r["workload"] == workload and r["system"] == system), None
                )
                if r is not None and r.get(field):
                    xs.append(wi + (si - (len(systems) - 1) / 2) * width)
                    ys.append(r[field])
            ax.bar(xs, ys, width, label=system, color=colours(si % 10))
        ax.set_yscale("log")
        ax.set_ylabel("events/s (log)")
        ax.set_title(title)
        ax.grid(axis="y", which="both", alpha=0.3)
    axes[-1].set_xticks(range(len(workloads)))
    axes[-1].set_xticklabels(workloads, rotation=30, ha="right")
    # Proxies: a system may have no bar in a panel, and still needs its legend entry.
    handles = [Patch(color=colours(si % 10), label=s) for si, s in enumerate(systems)]
    axes[0].legend(handles=handles, fontsize="small", ncol=2)
    m = doc.get("machine", {})
    fig.suptitle(
        f"epochstream vs peers, {m.get('date', '?')}, {m.get('nproc', '?')} CPUs "
        f"({m.get('cpu', '?')})",
        fontsize="medium",
    )
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(json.dumps({"png": png, "events": 0, "seconds": 1.0}))


if __name__ == "__main__":
    main()
