"""Slot logs to the driver: a logging handler that ships records over the control plane.

Slots run in Spark executors (or local-runner processes) whose stderr the user may
never see. While a slot runs, :class:`ForwardLogs` sits on the slot process's root
logger and sends every record at or above the driver's level as a ``SlotLog`` message;
the job master logs it on ``epochstream.slots`` with the slot and attempt in the line::

    [slot 1 attempt 2] epochstream.runtime.task: sum (2/2) failed: ValueError(...)

Logs are rare (warnings, errors, the user's own logging), never per record.

Example::

    with ForwardLogs(send, slot=0, attempt=1, level=logging.WARNING):
        run_the_slot()
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

__all__ = ["ForwardLogs", "SlotLog", "log_slot_record"]

_SLOT_LOG = logging.getLogger("epochstream.slots")


@dataclass(frozen=True)
class SlotLog:
    """One log record of a slot process (message with its traceback, if any).

    Example: ``SlotLog(slot=0, attempt=1, level=logging.WARNING, logger="job", message="hi")``
    """

    slot: int
    attempt: int
    level: int
    logger: str
    message: str


class ForwardLogs(logging.Handler):
    """Sends the slot process's log records to the job master while installed.

    Example: ``with ForwardLogs(control.send, slot=0, attempt=1, level=logging.WARNING): ...``
    """

    def __init__(self, send: Callable[[Any], None], *, slot: int, attempt: int, level: int) -> None:
        super().__init__(level)
        self._send = send
        self.slot = slot
        self.attempt = attempt
        self._sending = threading.local()
        self._root_level = logging.NOTSET

    def emit(self, record: logging.LogRecord) -> None:
        # A record logged while sending one (the send failing) must not recurse.
        if getattr(self._sending, "active", False):
            return
        self._sending.active = True
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
            self._send(SlotLog(self.slot, self.attempt, record.levelno, record.name, message))
        except OSError as exc:
            # The control connection is gone (the job master ended the attempt or
            # failed over): the record still goes somewhere a person can read it, as
            # one line on the process's stderr rather than logging's traceback.
            self._to_stderr(record, exc)
        finally:
            self._sending.active = False

    def _to_stderr(self, record: logging.LogRecord, error: OSError) -> None:
        try:
            sys.stderr.write(
                f"[slot {self.slot} attempt {self.attempt}] {record.levelname} {record.name}: "
                f"{record.getMessage()} (not forwarded: job master connection lost: {error!r})\n"
            )
            sys.stderr.flush()
        except (OSError, ValueError):  # stderr closed too: the record has nowhere to go
            pass

    def __enter__(self) -> ForwardLogs:
        root = logging.getLogger()
        self._root_level = root.level
        if root.level == logging.NOTSET or root.level > self.level:
            root.setLevel(self.level)
        root.addHandler(self)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Spark reuses Python workers: the next job's slot must not inherit this handler.
        root = logging.getLogger()
        root.removeHandler(self)
        root.setLevel(self._root_level)


def log_slot_record(msg: SlotLog) -> None:
    """Log a slot's record in the driver, naming the slot and attempt (job master).

    Example: ``log_slot_record(SlotLog(0, 1, logging.WARNING, "job", "hi"))``
    """
    _SLOT_LOG.log(
        msg.level, "[slot %d attempt %d] %s: %s", msg.slot, msg.attempt, msg.logger, msg.message
    )
