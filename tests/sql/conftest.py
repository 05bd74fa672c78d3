"""Puts this folder on ``sys.path`` (the suite imports test modules with
``--import-mode=importlib``), so the SQL tests share ``duckdb_oracle`` and
``nexmark_tables``."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = str(Path(__file__).parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
