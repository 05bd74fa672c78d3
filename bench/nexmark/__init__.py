"""Nexmark on epochstream: the queries on rows (``queries``) and on Arrow batches
(``columnar``), and their DuckDB oracle (``oracle``).

The harness and the tests put ``bench/`` on ``sys.path`` and register this package
with ``cloudpickle.register_pickle_by_value``: slots cannot import ``bench/``, so the
query functions travel by value, like a user's script.

Example::

    from nexmark import columnar, queries
"""
