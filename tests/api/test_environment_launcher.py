"""Environment.job_description and the launcher that execute() hands it to."""

from __future__ import annotations

import pytest

import epochstream as es
from epochstream.api import environment
from epochstream.api.environment import set_overrides
from epochstream.deploy.client import DriverLauncher
from epochstream.graph.launch import JobDescription, JobResult


class _Finished:
    """A handle on a job that already ended."""

    job_id = "fake-job"

    def result(self, timeout: float | None = None) -> JobResult:
        return JobResult(job_id=self.job_id, restarts=0)


class _Recording:
    """A launcher that runs nothing and keeps what it was handed."""

    def __init__(self) -> None:
        self.descriptions: list[JobDescription] = []

    def launch(self, description: JobDescription) -> _Finished:
        self.descriptions.append(description)
        return _Finished()


def test_execute_hands_the_launcher_a_typed_description() -> None:
    env = es.Environment(parallelism=2, runner="local", endpoint_host=None, metrics_interval=0.5)
    env.enable_checkpointing(0.5, storage="/tmp/es-launcher-test", retained=2)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=7, delay=0.1))
    backend = es.state.RocksDBStateBackend()
    env.set_state_backend(backend)
    env.from_sequence(0, 10).uid("numbers").print()
    launcher = _Recording()

    result = env.execute("described", launcher=launcher)

    assert result == JobResult(job_id="fake-job", restarts=0)
    (description,) = launcher.descriptions
    assert isinstance(description, JobDescription)
    assert (description.name, description.parallelism) == ("described", 2)
    assert description.graph.max_parallelism == env.max_parallelism
    assert not description.max_parallelism_explicit
    assert (description.runner, description.spark_master, description.spark) == (
        "local",
        None,
        None,
    )
    assert description.checkpoint_config is env.checkpoint_config
    assert description.restart_strategy.describe().startswith("fixed_delay")
    assert description.state_backend is backend
    assert description.endpoint_host is None and description.metrics_interval == 0.5
    assert (description.heartbeat_interval, description.heartbeat_timeout) == (1.0, 20.0)
    assert (description.endpoint_linger, description.endpoint_savepoints_anywhere) == (60.0, False)
    assert not description.trust_shared_storage
    assert (description.restore_from, description.allow_non_restored_state) == (None, False)
    assert not description.resume


def test_execute_async_returns_the_launchers_handle_and_starts_a_new_graph() -> None:
    env = es.Environment(parallelism=1, runner="local")
    env.from_collection([1, 2]).print()
    launcher = _Recording()
    handle = env.execute_async("first", launcher=launcher)
    assert isinstance(handle, _Finished)
    env.from_collection([3]).map(str).print()
    env.execute_async("second", launcher=launcher)
    first, second = (d.graph for d in launcher.descriptions)
    # As in Flink, each execute runs only what was built since the one before.
    assert len(second.chains) == 1 and len(first.chains) == 1
    assert [op.kind for op in second.chains[0].operators] == ["source", "map", "sink"]


def test_description_carries_restore_settings_and_cli_overrides() -> None:
    env = es.Environment(parallelism=1, runner="local", max_parallelism=64)
    env.from_sequence(0, 3).print()
    description = env.job_description("j", from_savepoint="/sp/a", allow_non_restored_state=True)
    assert description.restore_from == "/sp/a" and description.allow_non_restored_state
    assert description.max_parallelism_explicit and description.graph.max_parallelism == 64
    with pytest.raises(es.ConfigurationError, match="not both"):
        env.job_description("j", from_savepoint="/sp/a", restore_from="/ck/b")
    set_overrides(resume=True, trust_shared_storage=True)
    try:
        resumed = env.job_description("j")
        assert resumed.resume and resumed.restore_from is None and resumed.trust_shared_storage
        # A restore point the user names wins over --resume.
        assert not env.job_description("j", restore_from="/ck/b").resume
    finally:
        set_overrides(resume=None, trust_shared_storage=None)


def test_the_default_launcher_is_deploys_and_can_be_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Importing epochstream registers it: the API itself does not import deploy/.
    assert isinstance(environment._default_launcher, DriverLauncher)
    launcher = _Recording()
    monkeypatch.setattr(environment, "_default_launcher", None)
    env = es.Environment(parallelism=1, runner="local")
    env.from_collection([1]).print()
    with pytest.raises(es.ConfigurationError, match="no launcher"):
        env.execute("nowhere")
    environment.set_default_launcher(launcher)
    assert env.execute("defaulted").job_id == "fake-job"
    assert [d.name for d in launcher.descriptions] == ["defaulted"]
