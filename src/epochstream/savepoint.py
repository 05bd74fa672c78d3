"""Savepoints offline (the ``es.savepoint`` namespace).

Example::

    import epochstream as es

    table = es.savepoint.read("/sp/savepoint-3f2a9c-1b2c3d4e5f60", "counts", "_reduce")
    print(table.num_rows, table.column("key"))
"""

from epochstream.checkpoint.reader import read

__all__ = ["read"]
