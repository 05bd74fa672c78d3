"""Columnar W1 throughput (``w1_jobs.run_throughput("columnar", ...)``, the function
``bench/all.py`` runs for W1) in one process, for the epochstream on ``PYTHONPATH``:
one untimed 2M-event warm-up job, then ``--repeat`` timed jobs of ``--n`` events.
Run it alternately against two source trees to compare them::

    for i in 1 2 3; do for t in /tmp/before/src src; do
        PYTHONPATH=$t python bench/columnar_w1_throughput.py --n 200000000; done; done
"""

from __future__ import annotations

import argparse
import json
import os

import w1_jobs

from epochstream.deploy.spark import create_session


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=200_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = create_session("local[2]", app_name="columnar-w1")
    try:
        w1_jobs.run_throughput("columnar", 2_000_000, spark=spark)
        rates = [
            w1_jobs.run_throughput("columnar", args.n, spark=spark)["rate"]
            for _ in range(args.repeat)
        ]
    finally:
        spark.stop()
    print(json.dumps({"src": os.environ.get("PYTHONPATH", ""), "rates": rates}))


if __name__ == "__main__":
    main()
