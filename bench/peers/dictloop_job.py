"""Single-core baseline: workloads A and B as a plain CPython loop over a dict.

The loop calls the same three functions the epochstream job runs per record (map,
key selector, reduce) and counts each emitted record, so the difference to
epochstream is the engine: batching, serialisation, key-group routing, channels and
checkpoints. No fault tolerance, one core. Prints one JSON line.

Example::

    python bench/peers/dictloop_job.py B --n 10000000
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from workloads import B_KEYS, expected_b_total, peer_arguments


def _fold(
    records: Any, key: Callable[[Any], Any], reduce: Callable[[Any, Any], Any]
) -> tuple[int, dict[Any, Any]]:
    state: dict[Any, Any] = {}
    get = state.get
    emitted = 0
    for record in records:
        k = key(record)
        old = get(k)
        new = record if old is None else reduce(old, record)
        state[k] = new
        emitted += 1
    return emitted, state


def run_b(n: int) -> dict[str, Any]:
    """Keyed running sum of ``range(n)``; checks the final state's total."""
    start = time.perf_counter()
    records = map(lambda i: (i * 7919 % B_KEYS, i % 1000), range(n))
    emitted, state = _fold(records, lambda t: t[0], lambda a, b: (a[0], a[1] + b[1]))
    wall = time.perf_counter() - start
    total = sum(v[1] for v in state.values())
    if emitted != n or total != expected_b_total(n):
        raise SystemExit(f"dict loop B wrong: emitted {emitted}, total {total}")
    return {"events": n, "seconds": wall, "keys": len(state)}


def run_a(path: str, words: int) -> dict[str, Any]:
    """Word count of the text at ``path``; checks the number of words seen."""
    start = time.perf_counter()

    def words_of() -> Any:
        with open(path, encoding="utf-8") as f:
            for line in f:
                yield from line.split()

    records = map(lambda w: (w.lower(), 1), words_of())
    emitted, state = _fold(records, lambda t: t[0], lambda a, b: (a[0], a[1] + b[1]))
    wall = time.perf_counter() - start
    if emitted != words:
        raise SystemExit(f"dict loop A saw {emitted} words, expected {words}")
    return {"events": words, "seconds": wall, "keys": len(state)}


def main() -> None:
    parser = peer_arguments("dictloop_job peer")
    args = parser.parse_args()
    result = run_b(args.n) if args.workload == "B" else run_a(args.path, args.n)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
