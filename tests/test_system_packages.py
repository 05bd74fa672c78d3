"""scripts/system-packages.sh: what `make test` and CI install, and what a machine without
them is told (the tests that will be skipped), checked with a PATH of fake commands.

Example::

    subprocess.run(["bash", "scripts/system-packages.sh", "--check"])  # 1 if anything is missing
"""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "system-packages.sh"


def _check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/bash", str(SCRIPT), "--check"],
        env={"PATH": str(path)},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_missing_commands_are_named_with_the_tests_they_skip(tmp_path: Path) -> None:
    done = _check(tmp_path)  # an empty PATH: no java, chromium, chromedriver

    assert done.returncode == 1
    assert "will be SKIPPED" in done.stderr
    assert "chromium-driver: the dashboard's browser test" in done.stderr
    assert "openjdk-17-jre-headless: every Spark test" in done.stderr
    assert "apt-get install" in done.stderr


def test_commands_on_the_path_count_as_installed(tmp_path: Path) -> None:
    for name in ("java", "nats-server", "chromium", "chromedriver"):
        fake = tmp_path / name
        fake.write_text("#!/bin/sh\n")
        fake.chmod(0o755)

    done = _check(tmp_path)

    for name in ("openjdk", "nats-server:", "chromium:", "chromium-driver:"):
        assert name not in done.stderr
