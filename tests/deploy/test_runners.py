"""``LocalRunner``: slot processes that fail to start are still cancelled; a Ctrl-C to
the driver's process group leaves the slots to the driver (which takes a savepoint).

Example::

    runner = LocalRunner(parallelism=2)
    runner.start(launch, on_exit=print); runner.cancel(); runner.wait(5.0)
"""

from __future__ import annotations

import errno
import subprocess
import sys
from typing import Any

import pytest

from epochstream.deploy import runners
from epochstream.deploy.runners import LocalRunner
from epochstream.runtime.slot import SlotLaunch


def test_a_start_that_fails_midway_leaves_no_slot_process_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def popen(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        if started:  # the second slot: the process table or descriptors ran out
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        # A real process that would wait for the job master for a long time.
        proc = real_popen([sys.executable, "-c", "import time; time.sleep(60)"], **kwargs)
        started.append(proc)
        return proc

    monkeypatch.setattr(runners.subprocess, "Popen", popen)
    runner = LocalRunner(parallelism=2)
    launch = SlotLaunch(job_id="j", attempt=1, master=("127.0.0.1", 1), secret=b"s")
    with pytest.raises(OSError, match="temporarily unavailable"):
        runner.start(launch, on_exit=lambda err: None)

    assert runner.pids == [started[0].pid]
    runner.cancel()
    assert runner.wait(10.0)
    assert started[0].poll() is not None


_CTRL_C_DRIVER = """
import sys
import epochstream as es

env = es.Environment(parallelism=2, runner="local")
env.enable_checkpointing(0.2, storage=sys.argv[1])
env.from_sequence(0, 10**12, rate=200).uid("numbers").map(lambda x: x).uid("same").print()
client = env.execute_async("ctrl-c")
client.wait_for_checkpoint(1, timeout=120)
try:
    print("running", flush=True)
    client.result()
except KeyboardInterrupt:
    print("savepoint", client.cancel(savepoint=sys.argv[1] + "/savepoints", timeout=60), flush=True)
"""


def test_a_ctrl_c_reaches_the_driver_not_the_local_slots(tmp_path: Any) -> None:
    # A terminal sends SIGINT to the whole foreground process group; the driver must
    # still be able to take a savepoint through its slots before the job ends.
    import os
    import signal

    driver = subprocess.Popen(
        [sys.executable, "-c", _CTRL_C_DRIVER, str(tmp_path / "ckpt")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert driver.stdout is not None
        for line in driver.stdout:  # the job's printed records come first
            if line.strip() == "running":
                break
        os.killpg(driver.pid, signal.SIGINT)
        out, _ = driver.communicate(timeout=90)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    assert driver.returncode == 0, out
    savepoint = [line for line in out.splitlines() if line.startswith("savepoint ")]
    assert savepoint, out
    assert os.path.isfile(os.path.join(savepoint[0].split(" ", 1)[1], "_metadata"))
