"""Name binding: what a SELECT's column names refer to.

A :class:`Scope` maps each FROM item's qualifier and column names to the fields of the
planned input (a join renames the right side's clashes: ``id``, ``id0``);
:func:`bind` rewrites an expression's columns to those field names, keeping each
identifier's position for errors.

Example::

    scope = Scope.of("b", fields)
    bind(condition, scope)        # b.price -> price; an unknown name is a SqlError
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlglot import exp

from epochstream.sql.dialect import sql_error
from epochstream.sql.expressions import Field, refuse_subqueries

__all__ = ["Scope", "bind", "field_column", "identifier"]

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class Scope:
    """The names a SELECT's expressions can use: per FROM item, its qualifier (table
    name or alias; None for an unnamed subquery) and its column names, each mapped to
    the name of a field of the planned input (joins rename the right side's clashes)."""

    items: list[tuple[str | None, dict[str, str]]]

    @classmethod
    def of(cls, qualifier: str | None, fields: tuple[Field, ...]) -> Scope:
        return cls([(qualifier, {f.name: f.name for f in fields})])

    def with_columns(self, names: tuple[str, ...]) -> Scope:
        """This scope with extra columns on its (single) item: a TVF's window columns."""
        qualifier, columns = self.items[0]
        return Scope([(qualifier, {**columns, **{n: n for n in names}})])

    def resolve(self, column: exp.Column) -> str:
        """The field name ``column`` names; unknown or ambiguous names are errors."""
        qualifier = column.table
        if qualifier:
            for name, columns in self.items:
                if name == qualifier:
                    if column.name in columns:
                        return columns[column.name]
                    raise sql_error(
                        column,
                        f"{qualifier} has no column {column.name!r} (columns: "
                        f"{', '.join(sorted(columns))})",
                    )
            if len(self.items) == 1 and self.items[0][0] is None:
                return self.resolve(field_column(column.name))
            known = ", ".join(n for n, _ in self.items if n) or "none"
            raise sql_error(
                column.args.get("table"), f"unknown table alias {qualifier!r} (known: {known})"
            )
        found = [columns[column.name] for _, columns in self.items if column.name in columns]
        if not found:
            every = sorted({c for _, columns in self.items for c in columns})
            raise sql_error(column, f"unknown column {column.name!r} (columns: {', '.join(every)})")
        if len(found) > 1:
            raise sql_error(
                column, f"column {column.name!r} is ambiguous: qualify it with its table"
            )
        return found[0]

    def side(self, column: exp.Column) -> int:
        """Which FROM item ``column`` belongs to (its index)."""
        qualifier = column.table
        for i, (name, columns) in enumerate(self.items):
            if (qualifier and name == qualifier) or (not qualifier and column.name in columns):
                return i
        raise sql_error(column, f"unknown column {column.name!r}")


def bind(node: exp.Expression, scope: Scope) -> None:
    """Rewrite every column of ``node`` to the field name it names in ``scope``
    (qualifiers checked, then dropped)."""
    refuse_subqueries(node)
    for column in list(node.find_all(exp.Column)):
        if isinstance(column.this, exp.Star):
            continue
        name = scope.resolve(column)
        column.set("table", None)
        renamed = identifier(name)
        renamed.meta.update(column.this.meta)  # keeps the position for errors
        column.set("this", renamed)


def field_column(name: str) -> exp.Column:
    """A column reference to the field ``name``."""
    return exp.Column(this=identifier(name))


def identifier(name: str) -> exp.Identifier:
    """``name`` as an identifier, quoted only where it must be (shown in plans)."""
    return exp.to_identifier(name, quoted=not _PLAIN.fullmatch(name))
