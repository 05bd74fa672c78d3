"""CheckpointConfig: defaults, storage URLs and validation."""

from __future__ import annotations

import os

import pytest

from epochstream.core.checkpoint_config import CheckpointConfig
from epochstream.exceptions import ConfigurationError


def test_config_defaults_and_storage_url() -> None:
    cfg = CheckpointConfig()
    assert cfg.exactly_once and cfg.interval == 1.0 and cfg.retained == 1
    assert CheckpointConfig(mode="at_least_once").exactly_once is False
    assert CheckpointConfig(storage="file:///data/ck%20x").storage_location == "/data/ck x"
    relative = CheckpointConfig(storage="relative/dir").storage_location
    assert relative == os.path.abspath("relative/dir")
    assert CheckpointConfig(storage="s3://bucket/a/../b/").storage_location == "s3://bucket/b"
    assert CheckpointConfig(storage="s3://b/ck").savepoint_location == "s3://b/ck/savepoints"


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"interval": 0}, "interval"),
        ({"interval": float("nan")}, "interval"),
        ({"min_pause": -1.0}, "min_pause"),
        ({"timeout": 0.0}, "timeout"),
        ({"max_concurrent": 0}, "max_concurrent"),
        ({"max_concurrent": 1.5}, "max_concurrent"),
        ({"tolerable_failures": -1}, "tolerable_failures"),
        ({"retained": 0}, "retained"),
        ({"retained": True}, "retained"),
        ({"mode": "exactly-once"}, "mode"),
        ({"retain_on_cancel": "yes"}, "retain_on_cancel"),
        ({"storage": "hdfs://nn/x"}, "storage"),
        ({"storage": "file://host/x"}, "storage"),
        ({"storage": ""}, "storage"),
    ],
)
def test_config_rejects_bad_values(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        CheckpointConfig(**kwargs)
    assert fragment in str(info.value)
    assert repr(next(iter(kwargs.values())))[:8] in str(info.value)
