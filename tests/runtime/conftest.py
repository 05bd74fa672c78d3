"""Puts this folder on ``sys.path`` (the suite imports test modules with
``--import-mode=importlib``), so the tests share ``columnar_support``, ``task_support``
and ``operator_support``; and holds the operator tests' ``backends`` fixture."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = str(Path(__file__).parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from operator_support import Backends  # noqa: E402 - needs HERE on sys.path


@pytest.fixture(params=["heap", "rocksdb"])
def backends(request: pytest.FixtureRequest, tmp_path: Path) -> Backends:
    """Keyed backends of one kind, heap and then RocksDB, under this test's ``tmp_path``
    (test_timers.py has a ``backends`` of its own)."""
    return Backends(request.param, tmp_path)
