"""CheckpointConfig's unaligned checkpoints and aligned timeout: what combinations are
accepted, and the clear errors of those refused."""

from __future__ import annotations

import pytest

import epochstream as es
from epochstream.core.checkpoint_config import CheckpointConfig
from epochstream.exceptions import ConfigurationError


def test_unaligned_is_off_by_default() -> None:
    cfg = CheckpointConfig()
    assert cfg.unaligned is False and cfg.aligned_timeout == 0.0


@pytest.mark.parametrize("timeout", [0, 0.0, 0.5, 3])
def test_unaligned_with_or_without_an_aligned_timeout(timeout: float) -> None:
    cfg = CheckpointConfig(unaligned=True, aligned_timeout=timeout)
    assert cfg.unaligned and cfg.exactly_once and cfg.aligned_timeout == timeout


def test_environment_passes_the_options_through(tmp_path) -> None:
    env = es.Environment(parallelism=1)
    env.enable_checkpointing(1.0, storage=str(tmp_path), unaligned=True, aligned_timeout=0.5)
    assert env.checkpoint_config is not None
    assert env.checkpoint_config.unaligned and env.checkpoint_config.aligned_timeout == 0.5


def test_unaligned_needs_exactly_once() -> None:
    with pytest.raises(ConfigurationError, match="unaligned needs mode='exactly_once'"):
        CheckpointConfig(unaligned=True, mode="at_least_once")


@pytest.mark.parametrize("unaligned", [False, None])
def test_aligned_timeout_needs_unaligned(unaligned: bool | None) -> None:
    kwargs = {} if unaligned is None else {"unaligned": unaligned}
    with pytest.raises(ConfigurationError, match=r"aligned_timeout .* needs unaligned=True"):
        CheckpointConfig(aligned_timeout=0.5, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), "0.5", True, None, [0.5]])
def test_aligned_timeout_must_be_a_finite_number_of_seconds(bad: object) -> None:
    with pytest.raises(ConfigurationError, match=r"CheckpointConfig\.aligned_timeout") as info:
        CheckpointConfig(unaligned=True, aligned_timeout=bad)  # type: ignore[arg-type]
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize("bad", [1, 0, "yes", None])
def test_unaligned_must_be_a_bool(bad: object) -> None:
    with pytest.raises(ConfigurationError, match=r"CheckpointConfig\.unaligned must be a bool"):
        CheckpointConfig(unaligned=bad)  # type: ignore[arg-type]
