"""State schema evolution: what a snapshot records of a state's values, and what a new
version of a job may do with it.

Every snapshot records, per state, a :class:`StateSchema`: the ``version`` of the
descriptor that wrote it (``ValueStateDescriptor(..., version=2)``, default 1) and, in
savepoints, the *shapes* of its values: each class with named fields (a dataclass, a
``NamedTuple``, an attrs class) seen among the values, with its field names
(:class:`ValueShape`). Plain values (numbers, strings, tuples, dicts) have no shape:
their changes are declared by a version.

When a job restores a state, :func:`evolve` decides between three outcomes, the one
rule both the restore and ``epochstream check-upgrade`` apply:

- **restore** as saved: same kind and version, and no class with changed fields;
- **migrate**: the descriptor's version is higher than the saved one and it has
  ``migrate=fn``: every restored value becomes ``fn(value, saved_version)`` before the
  job sees any (list state: per element; map state: per map value);
- **fail**: another kind of state, a version lower than the saved one (a downgrade), a
  higher version without ``migrate``, or a class whose fields changed while the version
  stayed: the restore stops at once naming the operator, the state and the difference,
  never a silent mix of old and new values.

A serializer change needs no version: values are read with the serializer that wrote
them (savepoints and RocksDB keep it) and written with the new one.

Classes are compared by name (``module:qualname``): :func:`class_changes` resolves the
saved names in the process building the job (where the job script is ``__main__``) and
lists the differences, which the job master hands to the restoring tasks (modules are
looked up among those loaded, never imported).

Example::

    @dataclass
    class Profile:
        name: str

    schema = StateSchema(version=1, shapes=shapes_of([Profile("a")]))
    schema.to_json() == {"version": 1, "shapes": [{"class": "__main__:Profile", "fields": ["name"]}]}
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from epochstream.exceptions import CheckpointError

__all__ = [
    "RESTORE_ACTIONS",
    "StateSchema",
    "ValueShape",
    "Verdict",
    "class_changes",
    "evolve",
    "shape_of_type",
    "shapes_of",
    "shapes_of_types",
]

#: The outcomes of :func:`evolve`.
RESTORE_ACTIONS = ("restore", "migrate", "fail")


@dataclass(frozen=True, order=True)
class ValueShape:
    """A class with named fields, by ``module:qualname``, and its field names in order.

    Example: ``ValueShape("shop.models:Profile", ("name", "visits"))``
    """

    class_name: str
    fields: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"class": self.class_name, "fields": list(self.fields)}

    @staticmethod
    def from_json(doc: Any, where: str) -> ValueShape:
        ok = (
            isinstance(doc, dict)
            and isinstance(doc.get("class"), str)
            and isinstance(doc.get("fields"), list)
            and all(isinstance(f, str) for f in doc["fields"])
        )
        if not ok:
            raise CheckpointError(f"{where}: a value shape is {{class, fields}}, got {doc!r}")
        return ValueShape(doc["class"], tuple(doc["fields"]))


@dataclass(frozen=True)
class StateSchema:
    """What a snapshot records of one state: its descriptor's version and the shapes of
    its values (savepoints; empty when unknown).

    Example: ``StateSchema(version=2).to_json() == {"version": 2, "shapes": []}``
    """

    version: int = 1
    shapes: frozenset[ValueShape] = field(default_factory=frozenset)

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "shapes": [s.to_json() for s in sorted(self.shapes)]}

    @staticmethod
    def from_json(doc: Any, where: str) -> StateSchema:
        version = doc.get("version") if isinstance(doc, dict) else None
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise CheckpointError(f"{where}: a state schema needs a version >= 1, got {doc!r}")
        shapes = doc.get("shapes", [])
        if not isinstance(shapes, list):
            raise CheckpointError(f"{where}: shapes must be a list, got {shapes!r}")
        return StateSchema(
            version,
            frozenset(
                ValueShape.from_json(s, f"{where}.shapes[{i}]") for i, s in enumerate(shapes)
            ),
        )


_SHAPES: dict[type, ValueShape | None] = {}


def shape_of_type(cls: type) -> ValueShape | None:
    """The shape of instances of ``cls``, ``None`` for classes without named fields.

    Example: ``shape_of_type(int) is None``
    """
    shape = _SHAPES.get(cls, _SHAPES)
    if shape is not _SHAPES:
        return shape  # type: ignore[return-value]
    names = _field_names(cls)
    shape = None if names is None else ValueShape(f"{cls.__module__}:{cls.__qualname__}", names)
    _SHAPES[cls] = shape
    return shape


def _field_names(cls: type) -> tuple[str, ...] | None:
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls))
    named = getattr(cls, "_fields", None)
    if issubclass(cls, tuple) and isinstance(named, tuple):
        return named  # a NamedTuple
    attrs = getattr(cls, "__attrs_attrs__", None)
    if isinstance(attrs, tuple):
        return tuple(a.name for a in attrs)
    return None


def shapes_of(values: Iterable[Any]) -> frozenset[ValueShape]:
    """The shapes of ``values``' classes (one lookup per distinct class).

    Example: ``shapes_of([1, "a"]) == frozenset()``
    """
    return shapes_of_types(set(map(type, values)))


def shapes_of_types(classes: Iterable[type]) -> frozenset[ValueShape]:
    """The shapes of ``classes`` (those with named fields).

    Example: ``shapes_of_types({int, str}) == frozenset()``
    """
    found = (shape_of_type(cls) for cls in classes)
    return frozenset(s for s in found if s is not None)


def _resolve(class_name: str) -> type | None:
    """The class named ``module:qualname`` among the modules this process has loaded,
    ``None`` when it does not resolve. Nothing is imported: a savepoint's names do not
    make the driver run modules the job itself does not load (a class the job's code
    does not reach is not one its values will be mixed with)."""
    module_name, _, qualname = class_name.partition(":")
    module = sys.modules.get(module_name)
    if module is None:
        return None
    target: Any = module
    for part in qualname.split("."):
        target = getattr(target, part, None)
        if target is None:
            return None
    return target if isinstance(target, type) else None


def class_changes(schema: StateSchema) -> list[str]:
    """How the classes ``schema`` saw differ from the classes of those names in this
    process: one sentence per changed class (fields added, removed or reordered).
    Classes that do not resolve here (a module this process has not loaded, a name it
    lacks) are not judged.

    Example: ``class_changes(StateSchema(1, frozenset({ValueShape("m:P", ("a",))})))``
    """
    changes = []
    for shape in sorted(schema.shapes):
        cls = _resolve(shape.class_name)
        if cls is None:
            continue
        now = _field_names(cls)
        if now is None:
            changes.append(f"{shape.class_name} had fields {list(shape.fields)} and has none now")
            continue
        if now == shape.fields:
            continue
        added = [f for f in now if f not in shape.fields]
        removed = [f for f in shape.fields if f not in now]
        parts = [f"field {f!r} added" for f in added] + [f"field {f!r} removed" for f in removed]
        if not parts:
            parts = [f"fields reordered from {list(shape.fields)} to {list(now)}"]
        changes.append(f"{shape.class_name}: {', '.join(parts)}")
    return changes


@dataclass(frozen=True)
class Verdict:
    """What restoring one state does: ``action`` (one of :data:`RESTORE_ACTIONS`) and why.

    Example: ``Verdict("migrate", "version 1 -> 2 by migrate=")``
    """

    action: str
    reason: str = ""


def evolve(
    *,
    saved_kind: str,
    saved: StateSchema,
    kind: str,
    version: int,
    migrate: Callable[[Any, int], Any] | None,
    changes: list[str],
) -> Verdict:
    """The one rule for a restored state (see the module docstring): the saved kind and
    schema against the new descriptor's kind, version and migration function, given the
    class ``changes`` found for it.

    Example::

        evolve(saved_kind="value", saved=StateSchema(1), kind="value", version=2,
               migrate=None, changes=[]).action == "fail"
    """
    if saved_kind != kind:
        return Verdict("fail", f"it was saved as {saved_kind} state and is now {kind} state")
    if version < saved.version:
        return Verdict(
            "fail",
            f"it was saved at version {saved.version} and the descriptor has version "
            f"{version}: a downgrade cannot read newer values",
        )
    if version > saved.version:
        if migrate is None:
            return Verdict(
                "fail",
                f"it was saved at version {saved.version} and the descriptor has version "
                f"{version} without migrate=: give a function migrate(value, old_version)",
            )
        return Verdict("migrate", f"version {saved.version} -> {version} by migrate=")
    if changes:
        return Verdict(
            "fail",
            f"its values' classes changed ({'; '.join(changes)}) while the descriptor's "
            f"version stayed {version}: give version={version + 1} and migrate=fn to convert "
            "the saved values",
        )
    return Verdict("restore")
