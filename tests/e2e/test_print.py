"""ds.print() writes to the driver's stdout on every runner (slots have no terminal)."""

from __future__ import annotations

from typing import Any

import pytest

import epochstream as es


@pytest.mark.slow
@pytest.mark.parametrize("runner", [pytest.param("spark", marks=pytest.mark.spark), "local"])
def test_print_reaches_driver_stdout(
    runner: str, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest
) -> None:
    options: dict[str, Any] = {"runner": runner}
    if runner == "spark":
        options["spark"] = request.getfixturevalue("spark")
    env = es.Environment(parallelism=2, **options)
    env.from_collection(["alpha", "beta", "gamma"]).map(str.upper).print(prefix="words")
    env.execute("print")
    lines = sorted(capsys.readouterr().out.splitlines())
    assert [line.split("> ", 1)[1] for line in lines] == ["ALPHA", "BETA", "GAMMA"]
    assert all(line.startswith(("words:0> ", "words:1> ")) for line in lines)
