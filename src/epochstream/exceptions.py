"""All exceptions epochstream raises, in one tree.

::

    EpochstreamError
     +-- ConfigurationError          bad settings or a job graph that cannot run (never restarted)
     |    +-- UntrustedStorageError  a local checkpoint or savepoint path other users can change
     |    +-- SqlError               a SQL statement that cannot be parsed or planned (line, column)
     +-- JobExecutionError           execute() gave up; names the first cause and restart history
     +-- JobCancelled                the job was cancelled, or stopped with a savepoint
     +-- DataError                   bad input that retrying cannot fix (restarts are suppressed)
     |    +-- SourceDecodeError      a record a source cannot decode, with file and byte offset
     |    +-- SerializationError     a record or message that cannot be pickled between processes
     +-- StateError                  state that cannot be read, restored or redistributed
     |    +-- KeyEncodingError       a key that is unhashable or has no stable encoding (never restarted)
     |    +-- CorruptStateError      a state file missing or failing its checksum (restore falls back)
     +-- CheckpointError             a checkpoint that failed, was declined or timed out
     |    +-- StorageUnavailableError  checkpoint storage cannot be reached now (retried, never a fallback)
     +-- SinkError                   a sink that cannot commit or recover its transactions
     +-- AuthenticationError         a control- or data-plane peer without the job secret
     +-- UserFunctionError           a user function raised; names the operator and the record
 +-- TaskFailure                 a task failed; carries the remote traceback text
     +-- InjectedFailure             raised on purpose by epochstream.testing

Example::

    import epochstream as es

    try:
        env.execute("job")
    except es.JobExecutionError as err:
        print(err.cause, err.history)
"""

from __future__ import annotations

__all__ = [
    "AuthenticationError",
    "CheckpointError",
    "ConfigurationError",
    "CorruptStateError",
    "DataError",
    "EpochstreamError",
    "InjectedFailure",
    "JobCancelled",
    "JobExecutionError",
    "KeyEncodingError",
    "SerializationError",
    "SinkError",
    "SourceDecodeError",
    "SqlError",
    "StateError",
    "StorageUnavailableError",
    "TaskFailure",
    "UntrustedStorageError",
    "UserFunctionError",
]


def short_repr(value: object, limit: int = 200) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages that name a record
    (a failing ``__repr__`` is described instead of hiding the real error).

    Example: ``short_repr("x" * 500)[-3:] == "..."``
    """
    try:
        text = repr(value)
    except Exception as exc:
        text = f"<{type(value).__qualname__} with failing repr: {exc!r}>"
    return text if len(text) <= limit else text[:limit] + "..."


class EpochstreamError(Exception):
    """Base class of every error epochstream raises.

    Example: ``except es.EpochstreamError as err: log(err)``
    """

    #: When true, the job master fails the job at once instead of restarting it.
    suppress_restarts: bool = False


class ConfigurationError(EpochstreamError, ValueError):
    """Invalid configuration or a job graph that cannot be executed.

    Raised in a running task it fails the job at once: a restart would meet it again.

    Example: ``es.Environment(parallelism=0)`` raises it.
    """

    suppress_restarts = True


class UntrustedStorageError(ConfigurationError):
    """A local checkpoint or savepoint location that another local user could change.

    Checkpoints hold pickles: whoever can plant a ``_metadata`` file there runs code as
    the job's user when it is restored. The message names the path, its owner and mode,
    and the opt-out (``trust_shared_storage=True``, ``--trust-shared-storage``).

    Example: ``env.enable_checkpointing(storage="/tmp/shared")`` where ``/tmp/shared``
    is ``0777`` makes ``execute()`` raise it.
    """


class SqlError(ConfigurationError):
    """A SQL statement that cannot be parsed, bound or planned; the message starts with
    the position (``line L, column C: ...``) and says what is unsupported or wrong.

    Example::

        try:
            env.sql_query("SELECT nosuch FROM bids")
        except es.SqlError as err:
            print(err.line, err.column)     # 1, 8
    """

    def __init__(self, message: str, *, line: int = 0, column: int = 0) -> None:
        where = f"line {line}, column {column}: " if line else ""
        super().__init__(where + message)
        self.line = line
        self.column = column
        self.reason = message

    def __reduce__(self):  # keep the position across pickling
        return (_rebuild_sql_error, (self.reason, self.line, self.column))


def _rebuild_sql_error(message: str, line: int, column: int) -> SqlError:
    return SqlError(message, line=line, column=column)


class JobExecutionError(EpochstreamError):
    """The job failed for good.

    ``cause`` is the first failure's description, ``history`` the list of
    failures seen (one per attempt), ``restarts`` how many restarts were made.

    Example: ``except es.JobExecutionError as err: print(err.cause, err.restarts)``
    """

    def __init__(self, message: str, *, cause: str, history: list[str], restarts: int) -> None:
        super().__init__(message)
        self.cause = cause
        self.history = list(history)
        self.restarts = restarts


class JobCancelled(EpochstreamError):
    """The job was cancelled, or stopped with a savepoint (the message names its path).

    Example: ``client.cancel()`` then ``client.result()`` raises it.
    """


class DataError(EpochstreamError):
    """Bad input data; restarting would meet it again, so restarts are suppressed.

    Example: ``raise es.DataError("bad row 17")`` in a user function fails the job without restarts.
    """

    suppress_restarts = True


class SourceDecodeError(DataError):
    """A source could not decode a record; names the file and byte offset.

    Example: ``except es.SourceDecodeError as err: print(err.path, err.offset)``
    """

    def __init__(self, message: str, *, path: str, offset: int) -> None:
        super().__init__(message)
        self.path = path
        self.offset = offset

    def __reduce__(self):  # keep path/offset across pickling (task -> job master)
        return (_rebuild_decode_error, (str(self), self.path, self.offset))


def _rebuild_decode_error(message: str, path: str, offset: int) -> SourceDecodeError:
    return SourceDecodeError(message, path=path, offset=offset)


class SerializationError(DataError):
    """A record that cannot be pickled to cross from one slot to another, or a
    control message (a deployment, a split) that does not unpickle where it arrives.

    Records move between slots (after ``key_by``, ``rebalance``, ``broadcast``) as
    pickles; within a slot they are handed over by reference, so the same job may work
    at parallelism 1. The message names the record, its position and the edge.

    Example: ``key_by(...)`` over records holding an open file raises it.
    """


class StateError(EpochstreamError):
    """State that cannot be accessed, snapshotted or restored.

    Example: restoring a checkpoint whose operator uids the job lacks raises it.
    """


class KeyEncodingError(StateError, TypeError):
    """A key that is unhashable or whose type has no stable, process-independent encoding.

    Raised while routing a record, it names the key selector, the edge and the record,
    and fails the job without restarts (the same record would fail again).

    Example: ``key_by(lambda r: object())`` raises it when the first record is routed.
    """

    suppress_restarts = True


class CorruptStateError(StateError):
    """A state file of a snapshot is missing, truncated or fails its checksum.

    ``path`` names the file; ``checkpoint_id`` the snapshot being restored, when known.
    When a restore meets it, the job falls back to the previous retained checkpoint.

    Example: ``except es.CorruptStateError as err: print(err.path, err.checkpoint_id)``
    """

    def __init__(self, message: str, *, path: str, checkpoint_id: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.checkpoint_id = checkpoint_id

    def __reduce__(self):  # keep path/checkpoint id across pickling (task -> job master)
        return (_rebuild_corrupt, (str(self), self.path, self.checkpoint_id))


def _rebuild_corrupt(message: str, path: str, checkpoint_id: int | None) -> CorruptStateError:
    return CorruptStateError(message, path=path, checkpoint_id=checkpoint_id)


class CheckpointError(EpochstreamError):
    """A checkpoint failed: declined, timed out, or its storage failed.

    Example: a ``_metadata`` file that does not parse raises it, naming the file.
    """


class StorageUnavailableError(CheckpointError):
    """Checkpoint storage cannot be reached now: connection refused, a timeout, an HTTP
    5xx or throttling answer, a local path that cannot be written or read for a reason
    an operator can clear. Raised after bounded retries with back-off.

    It is not corruption: a restore that meets it never falls back to an older
    checkpoint. The job master waits for the storage (and says so) before the next
    attempt, without using up the restart strategy. ``path`` names the location.

    Example: ``except es.StorageUnavailableError as err: print(err.path)``
    """

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path

    def __reduce__(self):  # keep path across pickling (task -> job master)
        return (_rebuild_unavailable, (str(self), self.path))


def _rebuild_unavailable(message: str, path: str) -> StorageUnavailableError:
    return StorageUnavailableError(message, path=path)


class SinkError(EpochstreamError):
    """A sink could not commit, abort or recover a transaction.

    ``retryable=False`` marks an error a restart cannot fix (the job fails at once).

    Example: ``FileSink`` raises it for a record ``json.dumps`` cannot encode, naming the record.
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.suppress_restarts = not retryable

    def __reduce__(self):  # keep retryable across pickling (task -> job master)
        return (_rebuild_sink_error, (str(self), not self.suppress_restarts))


def _rebuild_sink_error(message: str, retryable: bool) -> SinkError:
    return SinkError(message, retryable=retryable)


class AuthenticationError(EpochstreamError):
    """A peer did not prove knowledge of the job secret.

    Example: ``connect(addr, wrong_secret, plane="data")`` raises it.
    """


class UserFunctionError(EpochstreamError):
    """A user function raised while processing ``record`` in operator ``operator``.

    The original exception is the ``__cause__``; restarts are suppressed when it asks
    for that (it is a :class:`DataError`, for example).

    Example: ``except es.UserFunctionError as err: print(err.operator, err.record_repr)``
    """

    def __init__(self, operator: str, record: object, cause: BaseException) -> None:
        text = short_repr(record)
        super().__init__(f"{operator} failed on record {text}: {type(cause).__name__}: {cause}")
        self.operator = operator
        self.record_repr = text
        self.suppress_restarts = bool(getattr(cause, "suppress_restarts", False))

    def __reduce__(self):
        return (
            _rebuild_user_error,
            (str(self), self.operator, self.record_repr, self.suppress_restarts),
        )


def _rebuild_user_error(
    message: str, operator: str, record: str, suppress: bool
) -> UserFunctionError:
    err = UserFunctionError.__new__(UserFunctionError)
    EpochstreamError.__init__(err, message)
    err.operator, err.record_repr, err.suppress_restarts = operator, record, suppress
    return err


class TaskFailure(EpochstreamError):
    """A task failed in a slot; ``remote_traceback`` holds the slot's traceback text.

    Example: ``except es.TaskFailure as err: print(err.remote_traceback)``
    """

    def __init__(self, message: str, *, remote_traceback: str = "") -> None:
        super().__init__(message)
        self.remote_traceback = remote_traceback

    def __reduce__(self):
        return (_rebuild_task_failure, (str(self), self.remote_traceback))


def _rebuild_task_failure(message: str, tb: str) -> TaskFailure:
    return TaskFailure(message, remote_traceback=tb)


class InjectedFailure(EpochstreamError):
    """A failure raised on purpose by :mod:`epochstream.testing`.

    Example: ``ds.map(es.testing.FailOnce(after_records=100))`` raises it once.
    """
