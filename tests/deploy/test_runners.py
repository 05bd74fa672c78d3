"""``LocalRunner``: slot processes that fail to start are still cancelled.

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
