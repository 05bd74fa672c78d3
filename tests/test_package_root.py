"""The package root: its public names, and the names that moved off it."""

from __future__ import annotations

import pytest

import epochstream as es
from epochstream.connectors import nexmark
from epochstream.core import checkpoint_stats, events


def test_every_public_name_resolves() -> None:
    for name in es.__all__:
        assert getattr(es, name) is not None, name


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("MIN_WATERMARK", lambda: es.WatermarkGenerator.MIN_WATERMARK),
        ("MAX_WATERMARK", lambda: es.WatermarkGenerator.MAX_WATERMARK),
        ("NexmarkSource", lambda: es.sources.NexmarkSource),
        ("NexmarkConfig", lambda: es.sources.nexmark.NexmarkConfig),
        ("write_nexmark_files", lambda: es.sources.nexmark.write_nexmark_files),
        ("TaskCheckpointStats", lambda: checkpoint_stats.TaskCheckpointStats),
    ],
)
def test_a_moved_name_still_resolves_with_a_warning_naming_its_new_home(old, new) -> None:
    assert old not in es.__all__
    with pytest.warns(DeprecationWarning, match="es\\." + old.split("_")[0]):
        value = getattr(es, old)
    assert value is new()


def test_watermark_bounds_are_the_runtime_ones() -> None:
    assert es.WatermarkGenerator.MIN_WATERMARK == events.MIN_WATERMARK
    assert es.WatermarkGenerator.MAX_WATERMARK == events.MAX_WATERMARK
    assert es.sources.nexmark is nexmark


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = es.no_such_name  # type: ignore[attr-defined]
