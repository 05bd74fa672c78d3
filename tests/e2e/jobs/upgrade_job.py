"""Versions of one job for ``tests/e2e/test_check_upgrade.py``: a savepoint of ``v1``,
then each later version checked with ``epochstream check-upgrade`` and really started
from it.

``upgrade_job.py MODE OUT [SAVEPOINTS]``: numbers -> users -> keyed ``profiles``
(value state ``profile``: a ``Profile`` dataclass; value state ``total``: an int) ->
an exactly-once FileSink ``files``.

- ``v1``: throttled; stops with a savepoint under SAVEPOINTS after two checkpoints and
  prints its path;
- ``same``: unchanged (bounded, unthrottled, as every later version);
- ``new-operator``: a keyed ``extra`` operator with its own state after ``profiles``;
- ``removed-operator``: no ``profiles`` (users go to the sink);
- ``renamed-uid``: ``profiles`` under the uid ``profiles-v2``;
- ``kind-changed``: ``profile`` asked for as list state;
- ``serializer-ttl``: ``total`` with a JSON serializer and a TTL;
- ``field-added``: ``Profile`` gains ``email``, the descriptor unchanged;
- ``migrated``: ``Profile`` gains ``email``, ``version=2`` and ``migrate=``;
- ``version-no-migrate``: ``Profile`` gains ``email``, ``version=2`` without ``migrate=``;
- ``max-parallelism``: the job sets a max parallelism other than the savepoint's.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys
from typing import Any

import epochstream as es

EVENTS = 3_000
USERS = 5
MODE = sys.argv[1]
WITH_EMAIL = MODE in ("field-added", "migrated", "version-no-migrate")

if WITH_EMAIL:

    @dataclasses.dataclass
    class Profile:
        name: str
        visits: int
        email: str = ""

else:

    @dataclasses.dataclass
    class Profile:  # type: ignore[no-redef]
        name: str
        visits: int


def migrate(old: Any, old_version: int) -> Profile:
    return Profile(old.name, old.visits, f"{old.name}@example.com")  # type: ignore[call-arg]


def profile_descriptor() -> Any:
    if MODE == "kind-changed":
        return es.state.ListStateDescriptor("profile")
    if MODE == "migrated":
        return es.state.ValueStateDescriptor("profile", version=2, migrate=migrate)
    if MODE == "version-no-migrate":
        return es.state.ValueStateDescriptor("profile", version=2)
    return es.state.ValueStateDescriptor("profile")


def total_descriptor() -> es.state.ValueStateDescriptor:
    if MODE == "serializer-ttl":
        return es.state.ValueStateDescriptor(
            "total",
            default=0,
            serializer=es.state.JsonSerializer(),
            ttl=dt.timedelta(hours=1),
        )
    return es.state.ValueStateDescriptor("total", default=0)


class CountVisits(es.KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.profile = ctx.get_state(profile_descriptor())
        self.total = ctx.get_state(total_descriptor())

    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        name = ctx.current_key
        old = self.profile.value()
        new = Profile(name, (old.visits if old else 0) + 1)
        self.profile.update(new)
        self.total.update(self.total.value() + 1)
        out.collect((name, new.visits))


class Extra(es.KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.seen = ctx.get_state(es.state.ValueStateDescriptor("seen", default=0))

    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        self.seen.update(self.seen.value() + 1)
        out.collect(value)


def user(i: int) -> str:
    return f"u{i % USERS}"


def main() -> None:
    out = sys.argv[2]
    env = es.Environment(parallelism=2, max_parallelism=64 if MODE == "max-parallelism" else None)
    env.enable_checkpointing(0.3)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=2, delay=0.2))
    rate = 1_000.0 if MODE == "v1" else None
    users = env.from_sequence(0, EVENTS, rate=rate).uid("numbers").map(user).uid("users")
    if MODE == "removed-operator":
        users.sink_to(es.sinks.FileSink(out)).uid("files")
    else:
        uid = "profiles-v2" if MODE == "renamed-uid" else "profiles"
        counted = users.key_by(lambda name: name).process(CountVisits()).uid(uid)
        if MODE == "new-operator":
            counted = counted.key_by(lambda row: row[0]).process(Extra()).uid("extra")
        counted.sink_to(es.sinks.FileSink(out)).uid("files")
    if MODE != "v1":
        env.execute("upgrades")
        return
    client = env.execute_async("upgrades")
    client.wait_for_checkpoint(2)
    print(client.cancel(savepoint=sys.argv[3]))


if __name__ == "__main__":
    main()
