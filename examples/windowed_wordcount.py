"""The seeds' declarative example in epochstream: words counted per 5-second window of
event time, over lines that carry their own timestamps (``"<ms> word word ..."``).

Run it: ``python examples/windowed_wordcount.py [--runner local]``. It writes a small
timestamped text, counts words per window with records up to 2 s out of order, and
prints ``(window start, word, count)`` per window; late lines go to a side output.
"""

from __future__ import annotations

import argparse
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import epochstream as es


class WithWindow(es.ProcessWindowFunction):
    """Adds the window's start to each ``(word, count)``."""

    def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
        for word, count in elements:
            out.collect((ctx.window.start, word, count))


def write_text(path: Path) -> None:
    words = "to be or not to be that is the question".split()
    start = 1_700_000_000_000
    with open(path, "w", encoding="utf-8") as f:
        for i in range(2_000):
            ts = start + i * 25 - (i * 613) % 2_000  # up to 2 s out of order
            f.write(f"{ts} {words[i % len(words)]} {words[(i * 7) % len(words)]}\n")
        f.write(f"{start} late\n")  # far behind everything before it


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runner", default="spark", choices=["spark", "local"])
    args = parser.parse_args()
    text = Path(tempfile.mkdtemp()) / "words.txt"
    write_text(text)

    env = es.Environment(parallelism=2, runner=args.runner)
    late = es.OutputTag("late")
    counts = (
        env.from_text_file(str(text))
        .assign_timestamps_and_watermarks(
            es.WatermarkStrategy.bounded_out_of_orderness(
                timedelta(seconds=2)
            ).with_timestamp_assigner(lambda line, ts: int(line.split(" ", 1)[0]))
        )
        .flat_map(lambda line: [(w, 1) for w in line.split()[1:]])
        .key_by(lambda t: t[0])
        .window(es.TumblingEventTimeWindows.of(timedelta(seconds=5)))
        .side_output_late_data(late)
        .reduce(lambda a, b: (a[0], a[1] + b[1]), WithWindow())
        .uid("window-counts")
    )
    counts.print("window")
    counts.get_side_output(late).print("late")
    env.execute("windowed-wordcount")


if __name__ == "__main__":
    main()
