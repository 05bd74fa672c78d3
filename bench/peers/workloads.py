"""The benchmark workloads, defined once for epochstream and every peer.

Standard library only: peer scripts import this module from their own virtualenvs
(Bytewax, PyFlink), where epochstream is not installed.

- Workload A (word count): a seeded random text over a fixed vocabulary, split into
  words, lowercased, counted per word.
- Workload B (keyed running sum): ``i`` for ``0 <= i < n`` becomes
  ``(i * 7919 % 100000, i % 1000)``; the running sum of the second field per key.
- Workload C (windowed word count): workload A's text with an event timestamp in front
  of each line (``"<ms> word word ..."``, ``C_STEP_MS`` per line, up to ``C_JITTER_MS``
  out of order); words counted per word and 5-second tumbling window of event time,
  with a watermark ``C_BOUND_MS`` behind the largest timestamp.

Example::

    path = ensure_text("/tmp/epochstream-bench/words.txt", size_mb=20)
    key, value = sequence_record(12345)          # (97_733_... % 100000, 345)
"""

from __future__ import annotations

import argparse
import os
import random
from collections.abc import Iterator

__all__ = [
    "B_KEYS",
    "C_BASE_MS",
    "C_BOUND_MS",
    "C_JITTER_MS",
    "C_STEP_MS",
    "C_WINDOW_MS",
    "TEXT_SEED",
    "VOCABULARY_SIZE",
    "ensure_sequence_csv",
    "ensure_text",
    "ensure_timestamped_text",
    "expected_b_total",
    "peer_arguments",
    "sequence_record",
    "split_text",
    "text_stats",
    "vocabulary",
]

TEXT_SEED = 20260601
VOCABULARY_SIZE = 20_000
B_KEYS = 100_000
C_BASE_MS = 1_700_000_000_000
C_STEP_MS = 3
C_JITTER_MS = 1_500
C_BOUND_MS = 2_000
C_WINDOW_MS = 5_000
_WORDS_PER_LINE = 12
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def sequence_record(i: int) -> tuple[int, int]:
    """Workload B's record for input ``i``. Example: ``sequence_record(1001) == (7926919 % 100000, 1)``."""
    return (i * 7919 % B_KEYS, i % 1000)


def expected_b_total(n: int) -> int:
    """The sum of every record's value over ``range(n)``, used to check peers' final state.

    Example: ``expected_b_total(2000) == 2 * sum(range(1000))``
    """
    full, rest = divmod(n, 1000)
    return full * 499_500 + rest * (rest - 1) // 2


def ensure_sequence_csv(directory: str, n: int, parts: int) -> str:
    """W1's input for file-reading peers: ``0 .. n-1``, one per line, in ``parts`` files.

    Reused when ``directory`` already holds the same ``n`` and ``parts``.

    Example: ``ensure_sequence_csv("/tmp/epochstream-bench/seq-1000000", 1_000_000, 4)``
    """
    stamp = os.path.join(directory, ".source")
    want = f"{n} {parts}\n"
    if os.path.exists(stamp):
        with open(stamp, encoding="ascii") as f:
            if f.read() == want:
                return directory
    os.makedirs(directory, exist_ok=True)
    per = -(-n // parts)
    for p in range(parts):
        lo, hi = p * per, min(n, (p + 1) * per)
        with open(os.path.join(directory, f"part-{p:04d}.csv"), "w", encoding="ascii") as f:
            if hi > lo:
                f.write("\n".join(map(str, range(lo, hi))))
                f.write("\n")
    with open(stamp, "w", encoding="ascii") as f:
        f.write(want)
    return directory


def vocabulary(seed: int = TEXT_SEED, size: int = VOCABULARY_SIZE) -> list[str]:
    """``size`` distinct words of 2-10 letters, about a third capitalised (so ``lower`` matters).

    Example: ``len(vocabulary()) == 20_000``
    """
    rng = random.Random(seed)
    words: set[str] = set()
    out: list[str] = []
    while len(out) < size:
        word = "".join(rng.choices(_LETTERS, k=rng.randint(2, 10)))
        if word in words:
            continue
        words.add(word)
        out.append(word.capitalize() if rng.random() < 0.33 else word)
    return out


def _lines(size_bytes: int, seed: int) -> Iterator[str]:
    """Lines of ``_WORDS_PER_LINE`` words drawn with Zipf-like weights, until ``size_bytes``."""
    words = vocabulary(seed)
    rng = random.Random(seed + 1)
    weights = [1.0 / (rank + 1) for rank in range(len(words))]
    written = 0
    while written < size_bytes:
        # Drawing a block at a time keeps generation well under the benchmark's own time.
        block = rng.choices(words, weights=weights, k=_WORDS_PER_LINE * 4096)
        for start in range(0, len(block), _WORDS_PER_LINE):
            line = " ".join(block[start : start + _WORDS_PER_LINE]) + "\n"
            written += len(line)
            yield line
            if written >= size_bytes:
                return


def ensure_text(path: str, size_mb: float, seed: int = TEXT_SEED) -> str:
    """Write the word-count input to ``path`` unless an identical one is there; return ``path``.

    The file is deterministic in ``(size_mb, seed)``; a ``.meta`` file beside it records
    both, so a file of another size or seed is regenerated.

    Example: ``ensure_text("/tmp/epochstream-bench/words.txt", size_mb=20)``
    """
    meta = f"{path}.meta"
    want = f"{size_mb} {seed}\n"
    if os.path.exists(path) and os.path.exists(meta):
        with open(meta, encoding="ascii") as f:
            if f.read() == want:
                return path
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="ascii") as f:
        f.writelines(_lines(int(size_mb * 1024 * 1024), seed))
    os.replace(tmp, path)
    with open(meta, "w", encoding="ascii") as f:
        f.write(want)
    return path


def ensure_timestamped_text(source: str, path: str) -> str:
    """Workload C's input: ``source`` (workload A's text) with ``"<ms> "`` before each line.

    Line ``i`` gets ``C_BASE_MS + i * C_STEP_MS - (i * 613) % C_JITTER_MS``: time moves
    forward with the lines, each up to ``C_JITTER_MS`` late, within the watermark bound.
    Regenerated only when the source changed.

    Example: ``ensure_timestamped_text(text, "/tmp/epochstream-bench/words-ts.txt")``
    """
    meta = f"{path}.meta"
    want = f"{os.path.getsize(source)} {C_STEP_MS} {C_JITTER_MS}\n"
    if os.path.exists(path) and os.path.exists(meta):
        with open(meta, encoding="ascii") as f:
            if f.read() == want:
                return path
    tmp = f"{path}.tmp"
    with open(source, encoding="ascii") as src, open(tmp, "w", encoding="ascii") as out:
        for i, line in enumerate(src):
            out.write(f"{C_BASE_MS + i * C_STEP_MS - (i * 613) % C_JITTER_MS} {line}")
    os.replace(tmp, path)
    with open(meta, "w", encoding="ascii") as f:
        f.write(want)
    return path


def text_stats(path: str) -> tuple[int, int]:
    """``(lines, words)`` of a text file, counted the way workload A splits it.

    Example: ``lines, words = text_stats(path)``
    """
    lines = words = 0
    with open(path, encoding="ascii") as f:
        for line in f:
            lines += 1
            words += len(line.split())
    return lines, words


def split_text(path: str, directory: str, parts: int) -> list[str]:
    """Copy ``path`` into ``parts`` files of whole lines under ``directory`` (for file-stream peers).

    Existing parts made from the same source size are reused.

    Example: ``split_text(path, "/tmp/epochstream-bench/words-parts", 16)``
    """
    os.makedirs(directory, exist_ok=True)
    stamp = os.path.join(directory, ".source")
    want = f"{os.path.getsize(path)} {parts}\n"
    names = [os.path.join(directory, f"part-{i:04d}.txt") for i in range(parts)]
    if os.path.exists(stamp):
        with open(stamp, encoding="ascii") as f:
            if f.read() == want and all(os.path.exists(n) for n in names):
                return names
    with open(path, encoding="ascii") as f:
        lines = f.readlines()
    per = -(-len(lines) // parts)
    for i, name in enumerate(names):
        with open(name, "w", encoding="ascii") as out:
            out.writelines(lines[i * per : (i + 1) * per])
    with open(stamp, "w", encoding="ascii") as f:
        f.write(want)
    return names


def peer_arguments(description: str) -> argparse.ArgumentParser:
    """The command line every peer job shares: ``WORKLOAD [--n N] [--path TEXT]``.

    Example: ``args = peer_arguments("bytewax peer").parse_args()``
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("workload", choices=["A", "B", "C"])
    parser.add_argument("--n", type=int, default=10_000_000)
    parser.add_argument("--path", default="")
    return parser
