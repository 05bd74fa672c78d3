"""A keyed profile per user whose value class changes between job versions, driven
through ``epochstream run`` by ``tests/e2e/test_state_evolution.py``.

``profile_job.py MODE OUT [SAVEPOINTS]``: counts visits of ``u0``..``u4`` over
``range(EVENTS)`` in a ``Profile`` dataclass per user (value state ``profile`` of
operator ``profiles``), into an exactly-once FileSink at OUT, each output the user, its
visits so far and its email.

- ``v1``: ``Profile(name, visits)``, throttled; stops with a savepoint under SAVEPOINTS
  after two checkpoints and prints its path;
- ``v2``: ``Profile(name, visits, email)`` with ``version=2`` and a ``migrate`` function
  filling the email of saved profiles;
- ``v2-unmigrated``: the same class, the descriptor unchanged (no version, no migrate).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import epochstream as es

EVENTS = 20_000
USERS = 5
MODE = sys.argv[1]

if MODE == "v1":

    @dataclasses.dataclass
    class Profile:
        name: str
        visits: int

else:

    @dataclasses.dataclass
    class Profile:  # type: ignore[no-redef]
        name: str
        visits: int
        email: str


def email_of(name: str) -> str:
    return f"{name}@example.com"


def migrate(old: Any, old_version: int) -> Profile:
    assert old_version == 1
    return Profile(old.name, old.visits, email_of(old.name))  # type: ignore[call-arg]


def descriptor() -> es.state.ValueStateDescriptor:
    if MODE == "v2":
        return es.state.ValueStateDescriptor("profile", version=2, migrate=migrate)
    return es.state.ValueStateDescriptor("profile")


class CountVisits(es.KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.profile = ctx.get_state(descriptor())

    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        name = ctx.current_key
        old = self.profile.value()
        if MODE == "v1":
            new = Profile(name, (old.visits if old else 0) + 1)  # type: ignore[call-arg]
            out.collect((name, new.visits, None))
        else:
            email = old.email if old else email_of(name)
            new = Profile(name, (old.visits if old else 0) + 1, email)  # type: ignore[call-arg]
            out.collect((name, new.visits, new.email))
        self.profile.update(new)


def user(i: int) -> str:
    return f"u{i % USERS}"


def main() -> None:
    out = sys.argv[2]
    env = es.Environment(parallelism=2)
    env.enable_checkpointing(0.3)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    rate = 2_000.0 if MODE == "v1" else None
    (
        env.from_sequence(0, EVENTS, rate=rate)
        .uid("numbers")
        .map(user)
        .uid("users")
        .key_by(lambda name: name)
        .process(CountVisits())
        .uid("profiles")
        .sink_to(es.sinks.FileSink(out))
        .uid("files")
    )
    if MODE != "v1":
        env.execute("profiles")
        return
    client = env.execute_async("profiles")
    client.wait_for_checkpoint(2)
    print(client.cancel(savepoint=sys.argv[3]))


if __name__ == "__main__":
    main()
