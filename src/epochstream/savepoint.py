"""Savepoints offline (the ``es.savepoint`` namespace): read, write, bootstrap, change.

Example::

    import epochstream as es

    table = es.savepoint.read("/sp/savepoint-3f2a9c-1b2c3d4e5f60", "counts", "_reduce")
    print(table.num_rows, table.column("key"))

    new = es.savepoint.new(max_parallelism=128)        # state for a job that never ran
    new.with_keyed_state("counts", "_reduce", words, key="word", value=["word", "n"])
    new.write("/sp/bootstrapped")

    sp = es.savepoint.load("/sp/bootstrapped")         # change a savepoint into a new one
    sp.map_values("counts", "_reduce", lambda t: (t[0], t[1] * 2)).write("/sp/doubled")
"""

from epochstream.checkpoint.reader import read
from epochstream.checkpoint.savepoint_writer import OperatorInfo, Savepoint, load, new

__all__ = ["OperatorInfo", "Savepoint", "load", "new", "read"]
