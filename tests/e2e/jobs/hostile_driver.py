"""A job driver with a small file-descriptor limit, for the tests that flood its ports.

``python hostile_driver.py OUT CKPT ADDR_FILE REPORT MARKERS PLANE``: lowers
``RLIMIT_NOFILE`` to 256, runs a keyed running count over a throttled sequence on the
local runner with checkpoints and one crash of a slot (so the restart needs fresh
descriptors, and slots register again, while the test floods a port), writes the
addresses to ADDR_FILE once running (the control plane's ``host``/``port``, the
endpoint's ``url``/``token``/``cap``) and the result to REPORT. PLANE says which port
the test floods: ``control`` (test_hostile_network.py) or ``endpoint``
(test_endpoint_floods.py), which sets how long the job runs.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys

import epochstream as es

N = 60_000
KEYS = 7
#: Input rate and the checkpoint after which a slot crashes, per flooded plane: the
#: endpoint floods take longer to build up, so that job runs longer.
TIMING = {"control": (3_000, 6), "endpoint": (2_000, 8)}


def key_of(i: int) -> tuple[int, int]:
    return (i % KEYS, 1)


def first(t: tuple[int, int]) -> int:
    return t[0]


def add(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return (a[0], a[1] + b[1])


def main() -> None:
    out, ckpt, addr_file, report, markers, plane = sys.argv[1:7]
    rate, crash_after = TIMING[plane]
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    env = es.Environment(parallelism=2, runner="local", endpoint_linger=0)
    env.enable_checkpointing(0.5, storage=ckpt)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.5))
    (
        env.from_sequence(0, N, rate=rate)
        .map(
            es.testing.FailOnce(
                after_checkpoints=crash_after, subtask=0, crash=True, marker_dir=markers
            )
        )
        .map(key_of)
        .key_by(first)
        .reduce(add)
        .uid("counts")
        .sink_to(es.sinks.FileSink(out))
    )
    client = env.execute_async(f"hostile-{plane}")
    client.wait_until_running()
    host, port = client.control_address
    endpoint = client._master.endpoint
    assert endpoint is not None
    with open(addr_file + ".tmp", "w") as f:
        json.dump(
            {
                "host": host,
                "port": port,
                "url": endpoint.url,
                "token": endpoint.token,
                "cap": endpoint.server.max_connections,
            },
            f,
        )
    os.replace(addr_file + ".tmp", addr_file)
    result = client.result()
    with open(report, "w") as f:
        json.dump(
            {
                "restarts": result.restarts,
                "failures": result.failures,
                "checkpoints": len(client.completed_checkpoints()),
            },
            f,
        )


if __name__ == "__main__":
    main()
