"""Streaming SQL: Flink SQL's syntax and append-only semantics, planned onto the columnar
operators (docs/sql.md).

Example::

    env.execute_sql("CREATE TABLE bid (...) WITH ('connector' = 'nexmark', ...)")
    stream = env.sql_query("SELECT auction, price FROM bid WHERE price > 100")
"""

from epochstream.sql.functions import ScalarFunction, udf

__all__ = ["ScalarFunction", "udf"]
