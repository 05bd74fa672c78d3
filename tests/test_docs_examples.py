"""Every ```python block in README.md and the documentation site's own pages runs here.

The tool is Sybil (https://sybil.readthedocs.io): unlike pytest-markdown-docs and
mktestdocs it keeps one namespace per page, so a page can set up a stream in one block
and use it in the next as a reader would, and it marks a block that cannot run with a
visible directive that carries the reason, which pytest reports as the skip reason::

    <!-- skip: next "needs a Kafka broker" -->

Each page runs as one test, its blocks in order, in a fresh temporary working directory
(so ``"out/"`` and ``"checkpoints"`` land there). The long pages kept from before the
site (architecture.md, connectors.md, benchmarks.md) are not executed: their code is
quoted from tests and benchmarks that run elsewhere. Jobs in the examples use the local
runner (``es.Environment(..., runner="local")``), which runs the slots without Spark.

Example::

    pytest -q tests/test_docs_examples.py -k getting-started
"""

from __future__ import annotations

import re
import unittest
from pathlib import Path

import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# Not executed: written before the site, their code is quoted (see the module docstring).
NOT_EXECUTED = {"architecture.md", "connectors.md", "benchmarks.md"}

PAGES = [
    p
    for p in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    if p.parent == ROOT or p.relative_to(DOCS).as_posix() not in NOT_EXECUTED
    if "```python" in p.read_text(encoding="utf-8")  # pages with examples only
]

SYBIL = Sybil(parsers=[PythonCodeBlockParser(), SkipParser()])


def _page_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_pages_found() -> None:
    names = {_page_id(p) for p in PAGES}
    assert "README.md" in names
    assert "docs/getting-started.md" in names


def test_every_skipped_example_says_why() -> None:
    """A block is left out only by ``<!-- skip: next "reason" -->``, one block at a time."""
    for page in PAGES:
        for match in re.finditer(r"<!--\s*skip:(.*?)-->", page.read_text(encoding="utf-8")):
            assert re.fullmatch(r'\s*next\s+"[^"]{10,}"\s*', match.group(1)), (
                f"{_page_id(page)}: {match.group(0)!r} must be skip: next with a reason"
            )


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_page_examples(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    document = SYBIL.parse(page)
    document.namespace["__name__"] = "__docs__"
    for example in document.examples():
        try:
            example.evaluate()
        except unittest.SkipTest:
            continue  # a block marked <!-- skip: next "reason" -->; the next one still runs
