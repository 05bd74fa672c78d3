"""Shared pieces of the end-to-end tests: input generators, the word-count job, oracles.

Used both in-process by the tests (``tests/e2e/conftest.py`` puts this folder on
``sys.path``) and by the subprocess job scripts next to it, which is why it lives in
``jobs/`` and only uses the public API (``import epochstream as es``).

Example::

    counts = write_corpus(tmp / "words.txt", lines=20_000, seed=7)
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.3, storage=str(tmp / "ckpt"))
    build_wordcount(env, tmp / "words.txt", tmp / "out", lines_per_second=3000)
    env.execute("wc")
    assert exactly_once_problems(es.testing.read_committed(tmp / "out"), counts) == []
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import epochstream as es

__all__ = [
    "VOCABULARY",
    "Throttle",
    "at_least_once_problems",
    "build_wordcount",
    "exactly_once_problems",
    "final_values",
    "is_python_process",
    "update_counts",
    "write_corpus",
]

#: A fixed vocabulary, so the expected counts depend on the seed only.
VOCABULARY: tuple[str, ...] = tuple(
    "alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima mike "
    "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee "
    "zulu apple banana cherry damson elder fig grape honeydew kiwi lemon mango nectarine "
    "olive peach".split()
)


def write_corpus(
    path: str | os.PathLike[str], *, lines: int, seed: int, max_words: int = 10
) -> Counter[str]:
    """Write ``lines`` lines of 1..max_words random vocabulary words; return the word counts.

    The counts are the oracle: what a failure-free word count must end with.

    Example: ``counts = write_corpus(tmp / "in.txt", lines=1000, seed=1)``
    """
    rng = random.Random(seed)
    counts: Counter[str] = Counter()
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(lines):
            words = rng.choices(VOCABULARY, k=rng.randint(1, max_words))
            counts.update(words)
            f.write(" ".join(words) + "\n")
    return counts


class Throttle(es.MapFunction):
    """Identity map that holds each subtask to ``per_second`` records/s.

    Makes a bounded input last long enough for a failure to land mid-run; it is a
    rate limit, not a timing assertion. The schedule starts at the subtask's first
    record (a slow source start must not be spent as a burst) and restarts in every
    attempt.

    Example: ``ds.map(Throttle(2000))``
    """

    CHECK_EVERY = 32

    def __init__(self, per_second: float) -> None:
        if per_second <= 0:
            raise ValueError(f"Throttle needs a positive rate, got {per_second}")
        self.per_second = per_second
        self._t0 = 0.0
        self._n = 0

    def open(self, ctx: es.RuntimeContext) -> None:
        self._n = 0

    def map(self, value: Any) -> Any:
        if self._n == 0:
            self._t0 = time.monotonic()
        self._n += 1
        if self._n % self.CHECK_EVERY == 0:
            ahead = self._n / self.per_second - (time.monotonic() - self._t0)
            if ahead > 0:
                time.sleep(ahead)
        return value


class CountPerKey(es.KeyedProcessFunction):
    """Emits ``(key, records of that key so far)`` for every record; the count is int
    value state ``n``."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(es.state.ValueStateDescriptor("n", default=0))

    def process_element(self, value: Any, ctx: Any, out: es.Collector) -> None:
        n = self.count.value() + 1
        self.count.update(n)
        out.collect((ctx.current_key, n))


def _split_words(line: str) -> list[str]:
    return line.split()


def _one(word: str) -> tuple[str, int]:
    return (word, 1)


def _first(pair: tuple[str, int]) -> str:
    return pair[0]


def _add_counts(a: tuple[str, int], b: tuple[str, int]) -> tuple[str, int]:
    return (a[0], a[1] + b[1])


def build_wordcount(
    env: es.Environment,
    text: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    lines_per_second: float | None = None,
    inject: es.MapFunction | None = None,
    counts_per_second: float | None = None,
) -> None:
    """Add the word-count pipeline to ``env``: text -> words -> rolling count -> FileSink.

    Every record of the output is ``[word, count so far]``. ``lines_per_second``
    throttles each source subtask; ``inject`` (e.g. a ``FailOnce``) runs on the lines;
    ``counts_per_second`` throttles each subtask after the count (a slow sink: with an
    unthrottled source, the count's input queues stay full).

    Example: ``build_wordcount(env, "in.txt", "out/", lines_per_second=3000)``
    """
    lines = env.from_text_file(os.fspath(text))
    if lines_per_second is not None:
        lines = lines.map(Throttle(lines_per_second))
    if inject is not None:
        lines = lines.map(inject)
    counts = lines.flat_map(_split_words).map(_one).key_by(_first).reduce(_add_counts)
    counts = counts.uid("word-counts")
    if counts_per_second is not None:
        counts = counts.map(Throttle(counts_per_second))
    counts.sink_to(es.sinks.FileSink(os.fspath(out)))


def update_counts(rows: Iterable[Any]) -> Counter[tuple[Any, Any]]:
    """How often each ``(key, value)`` update occurs in the output rows.

    Example: ``update_counts([["a", 1], ["a", 1]]) == Counter({("a", 1): 2})``
    """
    return Counter((row[0], row[1]) for row in rows)


def final_values(rows: Iterable[Any]) -> dict[Any, Any]:
    """The largest value seen per key (the final count of a monotone rolling count).

    Example: ``final_values([["a", 1], ["a", 2]]) == {"a": 2}``
    """
    finals: dict[Any, Any] = {}
    for key, value in rows:
        if key not in finals or value > finals[key]:
            finals[key] = value
    return finals


def exactly_once_problems(rows: list[Any], expected: Mapping[Any, int]) -> list[str]:
    """Why ``rows`` is not exactly the updates ``(k, 1..expected[k])``, each once ([] if it is).

    Example: ``exactly_once_problems([["a", 1]], {"a": 1}) == []``
    """
    seen = update_counts(rows)
    problems: list[str] = []
    dups = sorted((u, n) for u, n in seen.items() if n > 1)
    if dups:
        problems.append(f"{len(dups)} duplicated updates, e.g. {dups[:5]}")
    missing = [(k, i) for k, n in expected.items() for i in range(1, n + 1) if (k, i) not in seen]
    if missing:
        problems.append(f"{len(missing)} missing updates, e.g. {missing[:5]}")
    extra = sorted(u for u in seen if u[0] not in expected or not 1 <= u[1] <= expected[u[0]])
    if extra:
        problems.append(f"{len(extra)} unexpected updates, e.g. {extra[:5]}")
    finals = final_values(rows)
    if finals != dict(expected):
        wrong = {k: (finals.get(k), n) for k, n in expected.items() if finals.get(k) != n}
        problems.append(f"final counts differ (got, expected): {dict(list(wrong.items())[:5])}")
    return problems


def at_least_once_problems(rows: list[Any], expected: Mapping[Any, int]) -> list[str]:
    """Why ``rows`` lost something: every ``(k, 1..expected[k])`` must occur ([] if so).

    Duplicates and counts beyond the true total are allowed (at-least-once).

    Example: ``at_least_once_problems([["a", 1], ["a", 1]], {"a": 1}) == []``
    """
    seen = update_counts(rows)
    problems: list[str] = []
    missing = [(k, i) for k, n in expected.items() for i in range(1, n + 1) if (k, i) not in seen]
    if missing:
        problems.append(f"{len(missing)} lost updates, e.g. {missing[:5]}")
    finals = final_values(rows)
    short = {k: (finals.get(k), n) for k, n in expected.items() if finals.get(k, 0) < n}
    if short:
        problems.append(f"final counts below the truth (got, expected): {short}")
    unknown = sorted({k for k in finals if k not in expected})
    if unknown:
        problems.append(f"keys not in the input: {unknown[:5]}")
    return problems


def is_python_process(pid: int) -> bool:
    """True when ``pid`` is a live Python process (guards a SIGKILL against a wrong PID).

    Example: ``assert is_python_process(os.getpid())``
    """
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    return b"python" in cmdline.split(b"\0")[0].rsplit(b"/", 1)[-1]


def run_with_slot_killed(
    env: es.Environment, name: str, *, slot: int = 1, after_checkpoints: int = 2
) -> Any:
    """Run ``env``'s job, SIGKILL ``slot``'s process once ``after_checkpoints``
    checkpoints completed (the job must still be running), and return its result.

    Example: ``assert run_with_slot_killed(env, "crash").restarts >= 1``
    """
    client = env.execute_async(name)
    try:
        client.wait_for_checkpoint(after_checkpoints, timeout=120)
        pid = client.slot_pids()[slot]
        assert is_python_process(pid)
        assert not client.done, "the job finished before the kill"
        os.kill(pid, signal.SIGKILL)
        return client.result(timeout=240)
    finally:
        if not client.done:
            client.cancel()
