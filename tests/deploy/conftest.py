"""Puts this folder on ``sys.path`` (the suite imports test modules with
``--import-mode=importlib``), so the job master tests share ``jobmaster_support``, and
holds the fixture its ``JOBMASTER_MARKS`` apply."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import cloudpickle
import pytest

HERE = str(Path(__file__).parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import jobmaster_support  # noqa: E402 - needs HERE on sys.path


@pytest.fixture
def jobmaster_isolation(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Functions of the test module and of ``jobmaster_support`` go to the slots by value,
    as a job script's would; no job entry is written outside ``tmp_path``."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    modules = (request.module, jobmaster_support)
    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    yield
    for module in modules:
        cloudpickle.unregister_pickle_by_value(module)
