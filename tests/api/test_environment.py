"""Environment settings, validation and CLI overrides."""

from __future__ import annotations

import pytest

import epochstream as es
from epochstream.api.environment import set_overrides


def test_defaults_and_validation() -> None:
    env = es.Environment(parallelism=3, runner="local")
    assert env.max_parallelism == 128
    assert env.restart_strategy.describe().startswith("none")
    env.enable_checkpointing(0.5, storage="/tmp/x", mode="at_least_once", retained=2)
    assert env.checkpoint_config is not None and not env.checkpoint_config.exactly_once
    assert env.restart_strategy.describe().startswith("fixed_delay")
    with pytest.raises(es.ConfigurationError):
        es.Environment(parallelism=0)
    with pytest.raises(es.ConfigurationError):
        es.Environment(parallelism=2, runner="flink")
    with pytest.raises(es.ConfigurationError):
        env.enable_checkpointing(1.0, mode="sometimes")
    with pytest.raises(es.ConfigurationError):
        es.Environment(parallelism=4, max_parallelism=2)
    assert (env.metrics_interval, env.endpoint_linger) == (1.0, 60.0)
    with pytest.raises(es.ConfigurationError, match="metrics_interval"):
        es.Environment(parallelism=1, metrics_interval=-1.0)
    with pytest.raises(es.ConfigurationError, match="endpoint_linger"):
        es.Environment(parallelism=1, endpoint_linger=-5.0)


def test_overrides_apply_to_every_environment() -> None:
    set_overrides(parallelism=5, runner="local", checkpoint_dir="/tmp/over")
    try:
        env = es.Environment(parallelism=2, runner="spark")
        env.enable_checkpointing(1.0, storage="/tmp/mine")
        assert (env.parallelism, env.runner) == (5, "local")
        assert env.checkpoint_config is not None
        assert env.checkpoint_config.storage == "/tmp/over"
    finally:
        set_overrides(parallelism=None, runner=None, checkpoint_dir=None)
    assert es.Environment(parallelism=2, runner="local").parallelism == 2


def test_missing_input_file_fails_where_the_stream_is_built(tmp_path) -> None:
    """Like from_files: in the driver, before anything runs, naming the path."""
    env = es.Environment(parallelism=1, runner="local")
    with pytest.raises(es.ConfigurationError, match=r"nope\.txt"):
        env.from_text_file(str(tmp_path / "nope.txt"))


def test_unpicklable_function_is_a_clear_error() -> None:
    import threading

    lock = threading.Lock()
    env = es.Environment(parallelism=1, runner="local")
    env.from_sequence(0, 3).map(lambda i: (lock, i)).print()
    with pytest.raises(es.ConfigurationError, match="cannot be shipped"):
        env.execute("unpicklable")


def test_relative_paths_are_resolved_in_the_driver(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.txt").write_text("a b\nc\n")
    env = es.Environment(parallelism=2, runner="local")
    env.from_text_file("in.txt").flat_map(str.split).sink_to(es.sinks.FileSink("out"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the paths were resolved when the job was built
    env.execute("relative")
    assert sorted(es.testing.read_committed(tmp_path / "out")) == ["a", "b", "c"]
