"""JobDescription: what a launcher is handed."""

from __future__ import annotations

import dataclasses

import pytest

import epochstream as es


def test_description_is_frozen_and_names_its_graph() -> None:
    env = es.Environment(parallelism=3, runner="local")
    env.from_sequence(0, 3).print()
    description = env.job_description("named")
    assert (description.name, description.parallelism) == ("named", 3)
    assert description.graph.name == "named"
    with pytest.raises(dataclasses.FrozenInstanceError):
        description.runner = "spark"  # type: ignore[misc]
    with pytest.raises(TypeError, match="positional"):
        type(description)(description.graph)  # type: ignore[misc]
