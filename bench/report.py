"""The pure logic of the benchmark harness (``bench/all.py``): no Spark, no peers, no I/O.

- :func:`w1_expected_sums` / :func:`check_w1`: workload W1's closed form (the final
  running sum of every key) and the check of a job's per-key results against it.
- :func:`percentile` / :func:`latency_summary`: end-to-end latency percentiles.
- :func:`rate_series` / :func:`recovery_time`: a sink's throughput over time and the
  time from a kill until the throughput is back at 90 % of what it was before.
- :func:`summary_rows` / :func:`markdown`: the results table (JSON rows -> Markdown);
  a peer run both untuned and with its published tuning is quoted at the better of the
  two (:func:`better_tuning`), both shown.

Example::

    check_w1(1_000_000, {k: v for k, v in sink_results})        # raises on a wrong sum
    series = rate_series([(t, n) for t, n in batches], bin_s=0.25)
    recovery_time(series, kill_at=12.0)                         # e.g. 3.1 (seconds)
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "W1_KEYS",
    "W1_MULTIPLIER",
    "WARMUP_S",
    "W1ResultError",
    "better_tuning",
    "check_w1",
    "latency_summary",
    "markdown",
    "merge_documents",
    "overhead_pct",
    "percentile",
    "rate_series",
    "recovery_time",
    "steady",
    "summary_rows",
    "w1_expected_sums",
    "w1_expected_total",
]

W1_KEYS = 100_000
W1_MULTIPLIER = 7919
W1_VALUES = 1000


class W1ResultError(AssertionError):
    """A W1 run's per-key sums differ from the closed form; the message names keys."""


# ------------------------------------------------------------------ W1 closed form


def w1_expected_total(n: int) -> int:
    """Sum of ``i % 1000`` over ``range(n)``: the total of W1's final sums.

    Example: ``w1_expected_total(2000) == 2 * 499_500``
    """
    full, rest = divmod(n, W1_VALUES)
    return full * (W1_VALUES * (W1_VALUES - 1) // 2) + rest * (rest - 1) // 2


def w1_expected_sums(n: int) -> dict[int, int]:
    """Final running sum of every key W1 touches over ``range(n)``.

    Key ``k`` gets the inputs ``i = i0 + j * 100_000`` with ``i0 = k * 7919^-1 mod 100_000``
    (7919 is prime to 100_000, so that is all of them); 1000 divides 100_000, so every
    one of them has the value ``i0 % 1000``. No loop over ``n``.

    Example: ``w1_expected_sums(3) == {0: 0, 7919: 1, 15838: 2}``
    """
    inverse = pow(W1_MULTIPLIER, -1, W1_KEYS)
    out: dict[int, int] = {}
    for k in range(W1_KEYS):
        i0 = k * inverse % W1_KEYS
        if i0 >= n:
            continue
        count = (n - 1 - i0) // W1_KEYS + 1
        out[k] = count * (i0 % W1_VALUES)
    return out


def check_w1(n: int, sums: Mapping[int, int]) -> dict[str, int]:
    """Compare a job's final per-key sums with the closed form; raise :class:`W1ResultError`.

    Returns ``{"keys": ..., "total": ...}`` of a correct result.

    Example: ``check_w1(3, {0: 0, 7919: 1, 15838: 2}) == {"keys": 3, "total": 3}``
    """
    expected = w1_expected_sums(n)
    missing = sorted(set(expected) - set(sums))
    extra = sorted(set(sums) - set(expected))
    wrong = sorted(k for k in expected.keys() & sums.keys() if sums[k] != expected[k])
    if missing or extra or wrong:
        detail = "; ".join(
            part
            for part in (
                f"{len(missing)} keys missing (first {missing[:5]})" if missing else "",
                f"{len(extra)} unexpected keys (first {extra[:5]})" if extra else "",
                (
                    f"{len(wrong)} keys with wrong sums (first: key {wrong[0]} has "
                    f"{sums[wrong[0]]}, expected {expected[wrong[0]]})"
                    if wrong
                    else ""
                ),
            )
            if part
        )
        raise W1ResultError(f"W1 over {n:,} events: {detail}")
    total = sum(sums.values())
    if total != w1_expected_total(n):  # the per-key form and the total form must agree
        raise W1ResultError(f"W1 total {total} differs from {w1_expected_total(n)}")
    return {"keys": len(sums), "total": total}


# ------------------------------------------------------------------ latency


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0-100] of ``values`` (need not be sorted).

    Example: ``percentile([5, 1, 3, 2, 4], 50) == 3``
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 < q <= 100:
        raise ValueError(f"percentile q must be in (0, 100], got {q}")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def latency_summary(latencies_s: Sequence[float]) -> dict[str, float]:
    """p50, p99 and max in milliseconds, and the number of samples.

    Example: ``latency_summary([0.001] * 99 + [0.5])["p99_ms"] == 1.0``
    """
    return {
        "samples": len(latencies_s),
        "p50_ms": percentile(latencies_s, 50) * 1e3,
        "p99_ms": percentile(latencies_s, 99) * 1e3,
        "max_ms": max(latencies_s) * 1e3,
    }


#: Output of a latency run's first second is left out (start-up is not steady state);
#: epochstream's W1 runs and the peers' alike.
WARMUP_S = 1.0


def steady(emitted: Iterable[tuple[float, Sequence[float]]], warmup_s: float) -> list[float]:
    """The latencies of ``(emit wall time, latencies)`` pairs emitted at least ``warmup_s``
    after the first emit (start-up is not steady state); all of them if none was.

    Example: ``steady([(5.0, [0.9]), (5.5, [0.2]), (6.0, [0.1, 0.3])], 1.0) == [0.1, 0.3]``
    """
    pairs = [(t, lats) for t, lats in emitted if lats]
    if not pairs:
        return []
    first = min(t for t, _ in pairs)
    late = [lat for t, lats in pairs if t >= first + warmup_s for lat in lats]
    return late or [lat for _, lats in pairs for lat in lats]


# ------------------------------------------------------------------ recovery


def rate_series(
    samples: Iterable[tuple[float, int]], *, bin_s: float = 0.25
) -> list[tuple[float, float]]:
    """``(wall time, records)`` samples (one per sink batch) -> ``(bin start, records/s)``.

    Bins without samples are included with rate 0, from the first sample's bin to
    the last one's.

    Example: ``rate_series([(0.1, 10), (0.2, 10), (0.6, 5)], bin_s=0.5) == [(0.0, 40.0), (0.5, 10.0)]``
    """
    if bin_s <= 0:
        raise ValueError(f"bin_s must be positive, got {bin_s}")
    counts: dict[int, int] = {}
    for t, n in samples:
        b = math.floor(t / bin_s)
        counts[b] = counts.get(b, 0) + n
    if not counts:
        return []
    return [(b * bin_s, counts.get(b, 0) / bin_s) for b in range(min(counts), max(counts) + 1)]


def recovery_time(
    series: Sequence[tuple[float, float]],
    kill_at: float,
    *,
    baseline_s: float = 3.0,
    window_s: float = 1.0,
    fraction: float = 0.9,
) -> dict[str, float | None]:
    """Seconds from ``kill_at`` until the throughput is back at ``fraction`` of before.

    ``series`` is :func:`rate_series`'s output. The baseline is the mean rate over the
    ``baseline_s`` before the kill. The rate is smoothed over ``window_s`` (a trailing
    mean ending at each bin's end); the throughput is back at the first bin end after
    the smoothed rate dipped below ``fraction * baseline`` after the kill and rose to it
    again. ``recovery_s`` is None when it never came back within the series (or never
    dipped: then the kill did not interrupt anything and ``dipped`` is False).
    ``resumed_s`` is the end of the first bin after the dip whose own rate is back at
    half the baseline: output flowing again, before any catching up to full speed
    (on a busy machine the 90 % mark can take much longer than that).

    Example::

        series = [(t / 4, 100.0 if t < 40 or t >= 60 else 0.0) for t in range(100)]
        recovery_time(series, kill_at=10.0)["recovery_s"] == 6.0
    """
    if not series:
        return {"baseline_rate": None, "recovery_s": None, "resumed_s": None, "dipped": False}
    bin_s = series[1][0] - series[0][0] if len(series) > 1 else 1.0
    before = [r for t, r in series if kill_at - baseline_s <= t and t + bin_s <= kill_at]
    if not before:
        raise ValueError(
            f"no throughput samples in the {baseline_s} s before the kill at {kill_at}"
        )
    baseline = sum(before) / len(before)
    target = fraction * baseline
    width = max(1, round(window_s / bin_s))
    dipped = False
    resumed: float | None = None
    for i, (t, rate) in enumerate(series):
        end = t + bin_s
        if end <= kill_at or i + 1 < width:
            continue
        smoothed = sum(r for _, r in series[i + 1 - width : i + 1]) / width
        if not dipped:
            dipped = smoothed < target
            continue
        if resumed is None and rate >= baseline / 2:
            resumed = end - kill_at
        if smoothed >= target:
            return {
                "baseline_rate": baseline,
                "recovery_s": end - kill_at,
                "resumed_s": resumed,
                "dipped": True,
            }
    return {"baseline_rate": baseline, "recovery_s": None, "resumed_s": resumed, "dipped": dipped}


# ------------------------------------------------------------------ table


def overhead_pct(rate_on: float | None, rate_off: float | None) -> float | None:
    """Throughput lost to checkpoints, in percent: ``100 * (1 - on / off)``.

    Example: ``overhead_pct(900.0, 1000.0) == 10.0``
    """
    if not rate_on or not rate_off:
        return None
    return 100.0 * (1.0 - rate_on / rate_off)


def better_tuning(tunings: Mapping[str, Mapping[str, float]]) -> str | None:
    """The tuning with the higher rate: compared with checkpoints if any tuning has a
    checkpointed rate, else without; the first listed on a tie; None if none has a rate.

    ``tunings`` maps a tuning's name to its ``rate_on`` / ``rate_off``.

    Example: ``better_tuning({"untuned": {"rate_on": 2.0}, "tuned": {"rate_on": 3.0}}) == "tuned"``
    """
    ck = "rate_on" if any(t.get("rate_on") for t in tunings.values()) else "rate_off"
    best: str | None = None
    for name, rates in tunings.items():
        if rates.get(ck) and (best is None or rates[ck] > tunings[best][ck]):
            best = name
    return best


def summary_rows(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per (workload, system) from a results document's measurements.

    ``doc["rows"]`` holds throughput runs (``workload``, ``system``, ``checkpoints`` =
    ``"1 s"`` or ``"off"``, ``rate`` or ``error``, optional ``ours``: True for
    epochstream), ``doc["latency"]`` and ``doc["recovery"]`` the latency and recovery
    measurements (``workload``, ``system`` and their figures). ``ratios`` maps each of
    our systems of the workload to our rate with checkpoints / this system's (peers
    only, checkpoints on; a peer without a checkpointed figure is compared off to off);
    ``recovery_ratios`` to our recovery time / this system's (below 1: we are back
    sooner), where both were measured.

    A peer's runs may carry ``tuning`` (its name: untuned, or the peer's published
    tuning): their rates go to ``tunings`` (name -> ``rate_on`` / ``rate_off``), and
    the better tuning's (``tuning``) become the entry's rates, the ones the ratios use.
    ``handicap`` and ``settings`` (what the peer carries, what every run of it has)
    are taken from its runs.
    """
    order: list[tuple[str, str]] = []
    merged: dict[tuple[str, str], dict[str, Any]] = {}

    def entry(r: Mapping[str, Any]) -> dict[str, Any]:
        key = (r["workload"], r["system"])
        if key not in merged:
            order.append(key)
            merged[key] = {
                "workload": r["workload"],
                "system": r["system"],
                "ours": bool(r.get("ours")),
                "errors": [],
            }
        return merged[key]

    for r in doc.get("rows", []):
        e = entry(r)
        e["ours"] = e["ours"] or bool(r.get("ours"))
        e.update({k: r[k] for k in ("handicap", "settings") if r.get(k)})
        ck = "on" if r["checkpoints"] != "off" else "off"
        tuning = r.get("tuning")
        # A tuned or untuned run's rates land in its tuning's slot; the better is copied up.
        target = e if tuning is None else e.setdefault("tunings", {}).setdefault(tuning, {})
        if "rate" in r:
            target[f"rate_{ck}"] = r["rate"]
            target[f"events_{ck}"] = r.get("events")
        if r.get("error"):
            where = f"ckpt {r['checkpoints']}" + (f", {tuning}" if tuning else "")
            e["errors"].append(f"{where}: {r['error']}")
    for e in merged.values():
        if "tunings" in e:
            e["tuning"] = better_tuning(e["tunings"])
            if e["tuning"] is not None:
                e.update(e["tunings"][e["tuning"]])
    for r in doc.get("latency", []):
        e = entry(r)
        if r.get("error"):
            e["errors"].append(f"latency: {r['error']}")
        else:
            e.update({k: r[k] for k in ("p50_ms", "p99_ms", "latency_rate") if k in r})
    for r in doc.get("recovery", []):
        e = entry(r)
        if r.get("error"):
            e["errors"].append(f"recovery: {r['error']}")
        else:
            e["recovery_s"] = r.get("recovery_s")
            e["resumed_s"] = r.get("resumed_s")
    for e in merged.values():
        e["overhead_pct"] = overhead_pct(e.get("rate_on"), e.get("rate_off"))
    for (workload, _), e in merged.items():
        if e["ours"]:
            continue
        ratios: dict[str, float] = {}
        recovery_ratios: dict[str, float] = {}
        for (w2, s2), ours in merged.items():
            if w2 != workload or not ours["ours"]:
                continue
            ck = "on" if e.get("rate_on") else "off"
            if ours.get(f"rate_{ck}") and e.get(f"rate_{ck}"):
                ratios[s2] = ours[f"rate_{ck}"] / e[f"rate_{ck}"]
            if ours.get("recovery_s") and e.get("recovery_s"):
                recovery_ratios[s2] = ours["recovery_s"] / e["recovery_s"]
        e["ratios"] = ratios
        e["recovery_ratios"] = recovery_ratios
    workloads = list(dict.fromkeys(w for w, _ in order))
    # Grouped by workload (first-seen order), ours first, then systems as first seen.
    return [
        merged[k]
        for k in sorted(order, key=lambda k: (workloads.index(k[0]), not merged[k]["ours"]))
    ]


def _num(x: float | None, fmt: str) -> str:
    return "" if x is None else format(x, fmt)


def _tuning_cell(e: Mapping[str, Any]) -> str:
    """Which tuning the figures are, each tuning's rates (ckpt 1 s / off), and what
    every run had."""
    parts = []
    if e.get("tunings"):
        better = e.get("tuning")
        parts.append(f"better: {better}" if better else "no rate")
        for name, rates in e["tunings"].items():
            figures = " / ".join(
                _num(rates.get(f"rate_{ck}"), ",.0f") or "-" for ck in ("on", "off")
            )
            parts.append(f"{name}: {figures}")
    if e.get("settings"):
        parts.append(f"every run: {e['settings']}")
    return "; ".join(parts)


def markdown(doc: Mapping[str, Any]) -> str:
    """The results table in Markdown, with the machine, command and date above it.

    Example: ``print(markdown(json.load(open("bench/results/all.json"))))``
    """
    m = doc.get("machine", {})
    lines = [
        f"Run {m.get('date', '?')} on {m.get('nproc', '?')} CPUs ({m.get('cpu', '?')}), "
        f"{m.get('memory_gib', '?')} GiB, Python {m.get('python', '?')}, "
        f"PySpark {m.get('pyspark', '?')}, epochstream {m.get('epochstream', '?')} "
        f"({str(m.get('git_head', ''))[:10]}).",
        "",
        f"Command: `{doc.get('command', '?')}`",
        "",
        "| workload | system | events/s, ckpt 1 s | events/s, ckpt off | ckpt overhead "
        "| latency p50 / p99 ms (at events/s) | recovery s: 90 % (output again) "
        "| ours / system | peer's tuning (figures quoted: the better) | handicap here | notes |",
        "|---|---|---:|---:|---:|---|---:|---|---|---|---|",
    ]
    for e in summary_rows(doc):
        latency = ""
        if e.get("p50_ms") is not None:
            latency = f"{e['p50_ms']:,.1f} / {e['p99_ms']:,.1f}"
            if e.get("latency_rate"):
                latency += f" (at {e['latency_rate']:,.0f})"
        recovery_ratios = e.get("recovery_ratios", {})
        ratios = ", ".join(
            f"{s}: {r:.2f}x"
            + (f" (recovery time {recovery_ratios[s]:.2f}x)" if s in recovery_ratios else "")
            for s, r in sorted(e.get("ratios", {}).items())
        )
        overhead = e.get("overhead_pct")
        recovery = _num(e.get("recovery_s"), ".1f")
        if recovery and e.get("resumed_s") is not None:
            recovery += f" ({e['resumed_s']:.1f})"
        lines.append(
            f"| {e['workload']} | {e['system']} | {_num(e.get('rate_on'), ',.0f')} "
            f"| {_num(e.get('rate_off'), ',.0f')} "
            f"| {'' if overhead is None else f'{overhead:.0f} %'} | {latency} "
            f"| {recovery} | {ratios} | {_tuning_cell(e)} | {e.get('handicap', '')} "
            f"| {'; '.join(e['errors']).replace('|', '/')} |"
        )
    return "\n".join(lines) + "\n"


def merge_documents(paths: list[str]) -> dict[str, Any]:
    """One results document from the documents of a run made in parts: the first one's
    machine and settings, every part's command, and all their measurements.

    Example: ``merge_documents(["/tmp/peers/all.json", "/tmp/ours/all.json"])["rows"]``
    """
    docs = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            docs.append(json.load(f))
    merged = dict(docs[0])
    merged["command"] = " ; ".join(str(d.get("command", "")) for d in docs)
    merged["parts"] = [{"command": d.get("command"), "settings": d.get("settings")} for d in docs]
    for section in ("rows", "latency", "recovery"):
        merged[section] = [row for d in docs for row in d.get(section, [])]
    return merged
