"""The Flink SQL dialect: sqlglot's tokenizer, parser and generator, extended with what
Flink SQL writes and sqlglot's own dialects do not parse.

- window table-valued functions in FROM: ``TABLE(TUMBLE|HOP|CUMULATE|SESSION(TABLE t
  [PARTITION BY k], DESCRIPTOR(col), INTERVAL 'n' UNIT, ...))``, positional (Flink's
  order: HOP takes slide then size, CUMULATE step then size) or named (``DATA =>``,
  ``TIMECOL =>``, ``SIZE =>``, ...), as a :class:`WindowTVF` node;
- ``CREATE TABLE`` with ``WATERMARK FOR c AS expr``, ``METADATA [FROM 'k'] [VIRTUAL]``
  columns, ``PRIMARY KEY (..) NOT ENFORCED`` and ``WITH ('k' = 'v', ...)``
  (:class:`WithOptions`, each option with its position);
- ``EXECUTE STATEMENT SET BEGIN ...; ...; END`` grouped by :func:`parse_script`;
- backtick identifiers, case-sensitive as in Flink (``dateTime`` is not ``datetime``).

sqlglot (pinned to one major version: the parser overrides below use its protected
methods) was chosen over DataFusion's planner because DataFusion parses neither window
TVFs nor ``WATERMARK``/``WITH`` DDL and extending it takes Rust (docs/sql.md, Design).
Every parse error becomes a :class:`~epochstream.exceptions.SqlError` with the line and
column of the offending token.

Example::

    [stmt] = parse_script("SELECT auction FROM TABLE(TUMBLE(TABLE bid, "
                          "DESCRIPTOR(date_time), INTERVAL '10' SECOND))")
    stmt.find(WindowTVF).kind        # 'TUMBLE'
"""

from __future__ import annotations

import re
import typing as t

from sqlglot import exp, generator, parser, tokens
from sqlglot.dialects.dialect import Dialect, NormalizationStrategy
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from epochstream.exceptions import SqlError

__all__ = [
    "Flink",
    "MetadataColumn",
    "WindowTVF",
    "WithOptions",
    "node_position",
    "parse_script",
    "primary_key",
    "sql_error",
]

# --------------------------------------------------------------------------- AST nodes


class WindowTVF(exp.Expression):
    """``TABLE(kind(TABLE src [PARTITION BY ..], DESCRIPTOR(timecol), ...))`` in FROM.

    args: this = kind (TUMBLE/HOP/CUMULATE/SESSION), table = exp.Table (the input),
    partition_by = [exp.Column] (SESSION), timecol = exp.Column, size/slide/step/gap/offset =
    exp.Interval, alias = exp.TableAlias.
    """

    arg_types = {
        "this": True,
        "table": True,
        "partition_by": False,
        "timecol": True,
        "size": False,
        "slide": False,
        "step": False,
        "gap": False,
        "offset": False,
        "alias": False,
    }

    @property
    def alias(self) -> str:  # read by sqlglot's scope code for FROM sources
        a = self.args.get("alias")
        return a.name if a else ""

    @property
    def kind(self) -> str:
        """``TUMBLE``, ``HOP``, ``CUMULATE`` or ``SESSION``."""
        return str(self.this.name)


class TableArg(exp.Expression):
    """``TABLE t [PARTITION BY a, b]`` as a function argument."""

    arg_types = {"this": True, "partition_by": False}


class MetadataColumn(exp.Expression, exp.ColumnConstraintKind):
    """``METADATA [FROM 'key'] [VIRTUAL]`` on a column."""

    arg_types = {"this": False, "virtual": False}


class WithOptions(exp.Property):
    """``WITH ('k' = 'v', ...)``: connector options, kept as an ordered dict of strings."""

    arg_types = {"expressions": True}

    def options(self) -> dict[str, str]:
        """The options in the order written. Example: ``{'connector': 'kafka'}``."""
        return {e.this.name: e.expression.name for e in self.expressions}


_TVF_ARGS = {
    "TUMBLE": ("table", "timecol", "size", "offset"),
    "HOP": ("table", "timecol", "slide", "size", "offset"),
    "CUMULATE": ("table", "timecol", "step", "size", "offset"),
    "SESSION": ("table", "timecol", "gap"),
}
_NAMED = {
    "DATA": "table",
    "TIMECOL": "timecol",
    "SIZE": "size",
    "SLIDE": "slide",
    "STEP": "step",
    "GAP": "gap",
    "OFFSET": "offset",
}


def _unit_call(name: str, args: list[exp.Expression]) -> exp.Expression:
    """TIMESTAMPADD/TIMESTAMPDIFF(unit, ...) with the unit a keyword (a ``Var``), so that
    binding a query's columns does not look for a column ``SECOND``.

    Example: ``_unit_call("TIMESTAMPADD", [exp.column("second"), n, ts])``
    """
    if args and isinstance(args[0], exp.Column) and not args[0].table:
        unit = exp.var(args[0].name.upper())
        unit.meta.update(args[0].this.meta)  # keeps the position for errors
        args = [unit, *args[1:]]
    return exp.Anonymous(this=name, expressions=args)


class Flink(Dialect):
    """sqlglot's dialect for Flink SQL (see the module docstring).

    Example: ``sqlglot.parse_one("SELECT `dateTime` FROM bid", dialect=Flink)``
    """

    # Flink (Calcite) keeps identifier case: `dateTime` and datetime are different columns.
    NORMALIZATION_STRATEGY = NormalizationStrategy.CASE_SENSITIVE
    NULL_ORDERING = "nulls_are_small"
    # Flink's DATE_FORMAT takes Java SimpleDateFormat patterns.
    TIME_MAPPING = {
        "yyyy": "%Y",
        "MM": "%m",
        "dd": "%d",
        "HH": "%H",
        "mm": "%M",
        "ss": "%S",
        "SSS": "%f",
    }

    class Tokenizer(tokens.Tokenizer):
        # EXECUTE would swallow the rest of the statement as one string (a "command");
        # Flink's EXECUTE STATEMENT SET BEGIN ... END is grouped by parse_script instead.
        COMMANDS = tokens.Tokenizer.COMMANDS - {TokenType.EXECUTE}
        IDENTIFIERS = ["`"]
        QUOTES = ["'"]
        STRING_ESCAPES = ["'"]  # a backslash is an ordinary character in Flink SQL
        KEYWORDS = {
            **tokens.Tokenizer.KEYWORDS,
            "STRING": TokenType.TEXT,
            "BYTES": TokenType.VARBINARY,
            "ROW": TokenType.STRUCT,  # ROW<a INT, b STRING> / ROW(a INT): a struct type
            "TIMESTAMP_LTZ": TokenType.TIMESTAMPLTZ,
            "MULTISET": TokenType.ARRAY,
            "WATERMARK": TokenType.VAR,
            "DESCRIPTOR": TokenType.VAR,
            "ENFORCED": TokenType.VAR,
            "METADATA": TokenType.VAR,
            "SESSION": TokenType.VAR,  # SESSION(...) is a window function name in Flink
        }

    class Parser(parser.Parser):
        FUNCTIONS = {
            **parser.Parser.FUNCTIONS,
            "PROCTIME": lambda args: exp.Anonymous(this="PROCTIME", expressions=args),
            # Flink's TIMESTAMPDIFF(unit, t1, t2); sqlglot's own reads (t1, t2, unit).
            "TIMESTAMPDIFF": lambda args: _unit_call("TIMESTAMPDIFF", args),
            "TIMESTAMPADD": lambda args: _unit_call("TIMESTAMPADD", args),
        }

        CONSTRAINT_PARSERS = {
            **parser.Parser.CONSTRAINT_PARSERS,
            "WATERMARK": lambda self: self._parse_watermark(),
            "METADATA": lambda self: self.expression(
                MetadataColumn(
                    this=self._match_text_seq("FROM") and self._parse_string(),
                    virtual=self._match_text_seq("VIRTUAL"),
                )
            ),
        }
        SCHEMA_UNNAMED_CONSTRAINTS = {*parser.Parser.SCHEMA_UNNAMED_CONSTRAINTS, "WATERMARK"}

        PROPERTY_PARSERS = {
            **parser.Parser.PROPERTY_PARSERS,
            "WITH": lambda self: self._parse_with_options(),
        }

        def _parse_watermark(self) -> exp.Expression:
            token = self._prev
            if not self._match(TokenType.FOR):
                self.raise_error("Expected FOR after WATERMARK")
            column = self._parse_column()
            if not self._match(TokenType.ALIAS):
                self.raise_error("Expected AS <expression> in WATERMARK FOR")
            node = exp.WatermarkColumnConstraint(this=column, expression=self._parse_disjunction())
            return node.update_positions(token)

        def _parse_with_options(self) -> exp.Expression:
            token = self._prev
            if not self._match(TokenType.L_PAREN):
                self.raise_error("Expected ( after WITH")

            def option() -> exp.Expression:
                key = self._parse_string()
                if key is None:
                    self.raise_error("connector option names are quoted strings: 'key' = 'value'")
                if not self._match(TokenType.EQ):
                    self.raise_error("Expected = in WITH option")
                value = self._parse_string()
                if value is None:
                    self.raise_error("connector option values are quoted strings")
                return exp.PropertyEQ(this=key, expression=value).update_positions(key)

            options = self._parse_csv(option)
            self._match_r_paren()
            return WithOptions(expressions=options).update_positions(token)

        # ---- FROM TABLE(<window TVF>(...)) -------------------------------------------------

        def _parse_table(self, *args: t.Any, **kwargs: t.Any) -> t.Any:
            if (
                self._curr
                and self._curr.token_type == TokenType.TABLE
                and self._next
                and self._next.token_type == TokenType.L_PAREN
            ):
                return self._parse_window_tvf()
            return super()._parse_table(*args, **kwargs)

        def _parse_window_tvf(self) -> exp.Expression:
            start = self._curr
            self._advance(2)  # TABLE (
            name_token = self._curr
            kind = name_token.text.upper() if name_token else ""
            if kind not in _TVF_ARGS:
                self.raise_error(
                    f"unsupported table function {name_token.text if name_token else ''!r}: "
                    "TABLE(...) takes the window functions TUMBLE, HOP, CUMULATE or SESSION",
                    name_token,
                )
            self._advance()
            if not self._match(TokenType.L_PAREN):
                self.raise_error(f"Expected ( after {kind}")
            slots = _TVF_ARGS[kind]
            values: dict[str, t.Any] = {}
            position = 0
            while True:
                named = None
                if self._curr and self._next and self._next.token_type == TokenType.FARROW:
                    named = self._curr.text.upper()
                    if named not in _NAMED or _NAMED[named] not in slots:
                        self.raise_error(f"{kind} has no parameter {self._curr.text}", self._curr)
                    self._advance(2)
                slot = (
                    _NAMED[named] if named else (slots[position] if position < len(slots) else None)
                )
                if slot is None:
                    self.raise_error(f"{kind} takes at most {len(slots)} arguments")
                    break
                if slot in values:
                    self.raise_error(f"{kind}: {slot} given twice")
                values[slot] = self._parse_tvf_arg(kind, slot)
                position += 1
                if not self._match(TokenType.COMMA):
                    break
            self._match_r_paren()  # closes KIND(
            self._match_r_paren()  # closes TABLE(
            for required in ("table", "timecol"):
                if required not in values:
                    self.raise_error(f"{kind} needs its {required} argument", start)
            need = {"TUMBLE": "size", "HOP": "size", "CUMULATE": "size", "SESSION": "gap"}[kind]
            if need not in values:
                self.raise_error(f"{kind} needs an INTERVAL {need}", start)
            table_arg = values.pop("table")
            node = WindowTVF(
                this=exp.Var(this=kind),
                table=table_arg.this,
                partition_by=table_arg.args.get("partition_by"),
                **values,
            )
            alias = self._parse_table_alias()
            if alias:
                node.set("alias", alias)
            return node.update_positions(start)

        def _parse_tvf_arg(self, kind: str, slot: str) -> exp.Expression:
            token = self._curr
            if slot == "table":
                named = self._next and self._next.token_type in self.ID_VAR_TOKENS
                if not (named and self._match(TokenType.TABLE)):
                    # TABLE (SELECT ...) included: Flink takes a table or view name only.
                    self.raise_error(f"{kind}'s first argument is TABLE <name>", token)
                table = self._parse_table_parts()
                partition = None
                if self._match(TokenType.PARTITION_BY):
                    if kind != "SESSION":
                        self.raise_error(
                            f"PARTITION BY in {kind} is not supported (only SESSION)", self._prev
                        )
                    # one column, or several in parentheses: PARTITION BY (a, b)
                    if self._match(TokenType.L_PAREN, advance=False):
                        partition = self._parse_wrapped_csv(self._parse_column)
                    else:
                        partition = [self._parse_column()]  # type: ignore[list-item]
                return TableArg(this=table, partition_by=partition).update_positions(token)
            if slot == "timecol":
                if not (self._curr and self._curr.text.upper() == "DESCRIPTOR"):
                    self.raise_error(f"{kind}'s time column is DESCRIPTOR(<column>)", token)
                self._advance()
                cols = self._parse_wrapped_csv(self._parse_column)
                if len(cols) != 1:
                    self.raise_error("DESCRIPTOR takes exactly one time column", token)
                return t.cast(exp.Expression, cols[0])
            if not self._match(TokenType.INTERVAL, advance=False):
                self.raise_error(
                    f"{kind} {slot} must be an INTERVAL literal, e.g. INTERVAL '10' SECOND", token
                )
            return t.cast(exp.Expression, self._parse_interval())

    class Generator(generator.Generator):
        PROPERTIES_LOCATION = {
            **generator.Generator.PROPERTIES_LOCATION,
            WithOptions: exp.Properties.Location.POST_SCHEMA,
            exp.PartitionedByProperty: exp.Properties.Location.POST_SCHEMA,
        }
        TYPE_MAPPING = {
            **generator.Generator.TYPE_MAPPING,
            exp.DataType.Type.TEXT: "STRING",
            exp.DataType.Type.VARBINARY: "BYTES",
            exp.DataType.Type.TIMESTAMPLTZ: "TIMESTAMP_LTZ",
        }
        TRANSFORMS = {
            **generator.Generator.TRANSFORMS,
            WindowTVF: lambda self, e: (
                "TABLE({}({}))".format(
                    e.this.name,
                    ", ".join(
                        [
                            f"TABLE {self.sql(e, 'table')}"
                            + (
                                f" PARTITION BY {self.expressions(e, key='partition_by', flat=True)}"
                                if e.args.get("partition_by")
                                else ""
                            ),
                            f"DESCRIPTOR({self.sql(e, 'timecol')})",
                        ]
                        + [
                            self.sql(e, k)
                            for k in ("slide", "step", "size", "gap", "offset")
                            if e.args.get(k)
                        ]
                    ),
                )
                + (f" AS {self.sql(e, 'alias')}" if e.args.get("alias") else "")
            ),
            WithOptions: lambda self, e: "WITH ({})".format(
                ", ".join(
                    f"{self.sql(p, 'this')} = {self.sql(p, 'expression')}" for p in e.expressions
                )
            ),
            exp.PartitionedByProperty: lambda self, e: f"PARTITIONED BY {self.sql(e, 'this')}",
            MetadataColumn: lambda self, e: (
                "METADATA"
                + (f" FROM {self.sql(e, 'this')}" if e.args.get("this") else "")
                + (" VIRTUAL" if e.args.get("virtual") else "")
            ),
        }


def primary_key(create: exp.Create) -> tuple[list[str], bool]:
    """The declared primary key columns of a ``CREATE TABLE`` and whether ``NOT ENFORCED``
    was written (Flink refuses a key without it; so does the catalog).

    Example: ``primary_key(stmt) == (["id"], True)`` for ``PRIMARY KEY (id) NOT ENFORCED``.
    """

    def enforced_clause(kind: exp.Expression) -> bool:
        options = kind.args.get("options") or []
        words = [(o if isinstance(o, str) else o.sql()).upper() for o in options]
        return "NOT ENFORCED" in words

    for node in create.this.expressions:
        pk = node if isinstance(node, exp.PrimaryKey) else None
        if isinstance(node, exp.Constraint) and isinstance(node.expressions[0], exp.PrimaryKey):
            pk = node.expressions[0]
        if pk is not None:
            return [c.name for c in pk.expressions], enforced_clause(pk)
        if isinstance(node, exp.ColumnDef):
            for c in node.constraints:
                if isinstance(c.kind, exp.PrimaryKeyColumnConstraint):
                    return [node.name], enforced_clause(c.kind)
    return [], False


def _sql_error(err: ParseError | TokenError, sql: str) -> SqlError:
    if isinstance(err, ParseError) and err.errors:
        first = err.errors[0]
        line, col = first.get("line") or 0, first.get("col") or 0
        highlight = first.get("highlight") or ""
        # sqlglot reports the column of the token's last character.
        column = max(1, col - len(highlight) + 1) if highlight else col
        message = str(first.get("description") or err).strip()
        if message.startswith("Required keyword:"):
            # sqlglot's "Required keyword: 'this' missing for <class ...Where>": a
            # statement that ends (or a clause that stops) too early.
            message = f"syntax error: incomplete {highlight or 'statement'}"
        # sqlglot names a token by its repr: <Token token_type: ..., text: (, ...>.
        message = re.sub(r"<Token token_type: [^,]*, text: (.*?), line: [^>]*>", r"'\1'", message)
        return SqlError(message, line=line, column=column)
    # The tokenizer's cause says "Missing ' from <line>:<offset in the text>".
    missing = re.fullmatch(r"Missing (.) from (\d+):(\d+)", str(err.__cause__ or ""))
    if missing:
        quote, line, offset = missing.group(1), int(missing.group(2)), int(missing.group(3))
        column = offset - sql.rfind("\n", 0, offset)
        return SqlError(f"{quote} is not closed", line=line, column=column)
    return SqlError(str(err).splitlines()[0] if str(err) else type(err).__name__)


def parse_script(sql: str) -> list[exp.Expression | list[exp.Expression]]:
    """The statements of a ``;``-separated script; ``EXECUTE STATEMENT SET BEGIN ins;
    ins; END`` becomes one list. Raises :class:`SqlError` with the position.

    sqlglot splits on ``;`` before parsing, so a statement set is grouped on tokens.

    Example: ``parse_script("CREATE TABLE t (a INT) WITH ('connector'='print'); "
    "INSERT INTO t SELECT 1")`` gives two statements.
    """
    dialect = Flink()
    try:
        tokens = dialect.tokenize(sql)
    except TokenError as err:
        raise _sql_error(err, sql) from None
    out: list[t.Any] = []
    chunk: list[Token] = []
    group: list[t.Any] | None = None
    texts = [tok.text.upper() for tok in tokens]

    def flush() -> None:
        try:
            stmt = dialect.parser().parse(chunk, sql)[0]
        except ParseError as err:
            raise _sql_error(err, sql) from None
        if stmt is not None:
            (group if group is not None else out).append(stmt)

    i = 0
    while i < len(tokens):
        if texts[i : i + 4] == ["EXECUTE", "STATEMENT", "SET", "BEGIN"] and not chunk:
            group, i = [], i + 4
            continue
        if group is not None and texts[i] == "END" and not chunk:
            out.append(group)
            group, i = None, i + 1
            continue
        if tokens[i].token_type == TokenType.SEMICOLON:
            if chunk:
                flush()
            chunk = []
        else:
            chunk.append(tokens[i])
        i += 1
    if chunk:
        flush()
    if group is not None:
        last = tokens[-1]
        raise SqlError("EXECUTE STATEMENT SET BEGIN without END", line=last.line, column=last.col)
    return out


def node_position(node: exp.Expr | None) -> tuple[int, int]:
    """``(line, column)`` where ``node`` starts in the SQL text: the smallest position in
    its subtree (sqlglot keeps positions on identifiers, functions and this dialect's
    nodes, not on every node), else the nearest enclosing node's, else ``(0, 0)``.

    Example: ``SqlError("unknown column", line=l, column=c)`` with ``l, c = node_position(col)``
    """
    current = node
    while current is not None:
        found = [_start(sub) for sub in current.walk() if sub.meta.get("line")]
        if found:
            return min(found)
        current = current.parent
    return 0, 0


def _start(node: exp.Expr) -> tuple[int, int]:
    meta = node.meta
    col = meta.get("col", 0)
    start, end = meta.get("start"), meta.get("end")
    # sqlglot's col is the token's last column; report its first.
    if start is not None and end is not None:
        col = max(1, col - (end - start))
    return int(meta["line"]), int(col)


def sql_text(node: exp.Expression) -> str:
    """``node`` written back as Flink SQL (for messages and plan descriptions).

    Example: ``sql_text(parse_one("select a+1 from t")) == "SELECT a + 1 FROM t"``
    """
    return node.sql(dialect=Flink)


def shortened(text: str, limit: int = 120) -> str:
    """``text`` on one line, cut to ``limit`` characters with ``...``.

    Example: ``shortened("SELECT a,\n  b FROM t") == "SELECT a, b FROM t"``
    """
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def sql_error(node: exp.Expr | None, message: str) -> SqlError:
    """A one-line :class:`SqlError` at ``node``'s position (the one helper every part of
    the SQL layer reports with).

    Example: ``raise sql_error(column, f"unknown column {column.name!r}")``
    """
    line, column = node_position(node)
    return SqlError(" ".join(message.split()), line=line, column=column)
