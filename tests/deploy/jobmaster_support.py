"""What the job master tests share: ``ThreadRunner`` (every slot a thread of this process
running the real slot code), the environment and the running-sum job they run, and the
check that its output is exactly once.

Every job master test module sets ``pytestmark = JOBMASTER_MARKS``: its functions and this
module's go to the slots by value (``jobmaster_isolation`` in conftest.py).

Example::

    env = make_env(tmp_path)
    sums_pipeline(env, env.from_collection(range(200)), tmp_path / "out")
    result = JobMaster(env.job_description("bounded"), runner=ThreadRunner(2)).run()
    assert exactly_once_problems(es.testing.read_committed(tmp_path / "out"), 200) == []
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import epochstream as es
from epochstream.deploy.client import JobClient
from epochstream.deploy.jobmaster import JobMaster
from epochstream.deploy.runners import OnExit, Runner
from epochstream.runtime.slot import SlotLaunch, run_slot

#: Seconds any single wait of these tests may take before the test fails.
WAIT = 20.0


#: The marks of every job master test module: ``jobmaster_isolation`` (conftest.py), and a
#: filter because cancelled slots are threads here: one whose data or control socket the
#: shutdown closed under it dies with BrokenPipeError while reporting (a subprocess slot
#: just exits).
JOBMASTER_MARKS = [
    pytest.mark.usefixtures("jobmaster_isolation"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning"),
]


class ThreadRunner(Runner):
    """Runs every slot of an attempt as a thread of this process calling ``run_slot``.

    A slot that raises is reported through ``on_exit``; clean exits are not: the job
    master learns that a finished attempt's slots are done from their ``SlotClosed``
    (reporting the exit too would race with that message, see
    ``test_runner_exit_before_the_last_slot_closed_message_still_finishes`` in
    test_jobmaster_scripted.py).
    """

    def __init__(self, parallelism: int) -> None:
        self.parallelism = parallelism
        self.attempts: list[int] = []
        self.cancels = 0
        self.closed = False
        self.errors: list[BaseException] = []
        self._threads: list[threading.Thread] = []

    def control_host(self) -> str:
        return "127.0.0.1"

    def start(self, launch: SlotLaunch, on_exit: OnExit) -> None:
        self.attempts.append(launch.attempt)
        errors: list[BaseException] = []

        def slot(index: int) -> None:
            try:
                run_slot(launch, index=index, host="127.0.0.1")
            except BaseException as exc:  # reported like a failed slot process
                errors.append(exc)

        threads = [
            threading.Thread(
                target=slot, args=(i,), name=f"slot-a{launch.attempt}-{i}", daemon=True
            )
            for i in range(self.parallelism)
        ]
        for t in threads:
            t.start()
        self._threads = threads

        def watch() -> None:
            for t in threads:
                t.join()
            if errors:
                self.errors.extend(errors)
                on_exit(errors[0])

        threading.Thread(target=watch, name=f"watch-a{launch.attempt}", daemon=True).start()

    def cancel(self) -> None:
        # The job master has told the slots (CancelSlot, closed connection) already.
        self.cancels += 1

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def close(self) -> None:
        self.closed = True
        self.wait(WAIT)


def wait_for(condition: Callable[[], bool]) -> None:
    """Poll ``condition`` until it holds; fail the test after ``WAIT`` seconds."""
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def make_env(
    tmp_path: Path, *, checkpointing: bool = True, parallelism: int = 2, **cfg: Any
) -> es.Environment:
    """A local environment for the job master, without HTTP endpoint; checkpoints every
    0.1 s (or ``interval``) to ``tmp_path/ckpt`` unless ``checkpointing`` is False."""
    env = es.Environment(parallelism=parallelism, runner="local", heartbeat_interval=0.2)
    env.endpoint_host = None  # no HTTP endpoint: the job master is driven directly
    if checkpointing:
        env.enable_checkpointing(cfg.pop("interval", 0.1), storage=str(tmp_path / "ckpt"), **cfg)
    return env


def pair(i: int) -> tuple[int, int]:
    """Record ``i`` as ``(key, value)``: five keys, values ``i + 1``."""
    return (i % 5, i + 1)


def pair_key(t: tuple[int, int]) -> int:
    """Key selector of the pairs: the key."""
    return t[0]


def sum_pairs(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    """Reduce function of the pairs: the key and the running sum."""
    return (a[0], a[1] + b[1])


def mod3(i: int) -> int:
    """Key selector (and map) of integer records: three keys."""
    return i % 3


def sums_pipeline(env: es.Environment, source: es.DataStream, out: Path) -> None:
    """The running sum per key of ``source``, written to a ``FileSink`` at ``out``."""
    source.map(pair).key_by(pair_key).reduce(sum_pairs).sink_to(es.sinks.FileSink(str(out)))


def exactly_once_problems(rows: list[list[int]], n: int, keys: int = 5) -> list[str]:
    """Running sums arrive in a nondeterministic order per key (parallel splits), so check
    what every order must give: sorted sums step by exactly the key's inputs, each once."""
    sums: dict[int, list[int]] = collections.defaultdict(list)
    for key, value in rows:
        sums[key].append(value)
    problems = []
    for k in range(keys):
        got = sorted(sums.get(k, []))
        steps = [b - a for a, b in zip([0, *got], got, strict=False)]
        inputs = [i + 1 for i in range(k, n, keys)]
        if collections.Counter(steps) != collections.Counter(inputs):
            problems.append(f"key {k}: {len(got)} updates, expected {len(inputs)}")
    return problems


def running_client(env: es.Environment, name: str) -> tuple[JobClient, JobMaster]:
    """Start the job of ``env`` on ``ThreadRunner`` slots; return once it runs."""
    master = JobMaster(env.job_description(name), runner=ThreadRunner(env.parallelism))
    client = JobClient(master)
    client.wait_until_running(WAIT)
    return client, master


def drop_jsonl(directory: Path, name: str, values: range) -> None:
    """Write ``{"i": v}`` lines into ``directory/name`` atomically (hidden name, then a rename)."""
    hidden = directory / f".{name}"
    hidden.write_text("".join(f'{{"i": {i}}}\n' for i in values))
    os.replace(hidden, directory / name)
