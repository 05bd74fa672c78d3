"""What the S3 checkpoint storage tests share: checkpoint metadata to write, and the
files under an S3 prefix (decided from files: SeaweedFS keeps listing a deleted prefix
for a few minutes).

The server and the buckets come from the fixtures in tests/conftest.py (``s3_bucket``,
``s3_options``).

Example::

    storage = CheckpointStorage(f"{s3_bucket}/ck", "job-a", s3_options)
    storage.write_metadata(2, checkpoint_metadata("job-a", 2))
    list(files_under(storage.fs, storage.job_dir))
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from epochstream.checkpoint.metadata import CheckpointMetadata
from epochstream.core.checkpoint_stats import CheckpointStats
from epochstream.core.filesystems import StorageFS
from epochstream.state.handles import OperatorSubtaskState

#: ``storage_options`` of the S3 server (the ``s3_options`` fixture).
Options = dict[str, str]

MAX_P = 128


def checkpoint_metadata(
    job_id: str, n: int, operators: dict[str, Any] | None = None, **extra: Any
) -> Any:
    """Metadata of checkpoint ``n`` of ``job_id``: one source subtask at offset ``10 * n``
    unless ``operators`` are given; ``extra`` goes to ``CheckpointMetadata``."""
    ops = operators or {"src": {0: OperatorSubtaskState(operator_lists={"offsets": [n * 10]})}}
    return CheckpointMetadata(
        job_id=job_id,
        checkpoint_id=n,
        trigger_time=float(n),
        completion_time=n + 0.5,
        parallelism=1,
        max_parallelism=MAX_P,
        operators=ops,
        operator_parallelism={uid: len(subtasks) for uid, subtasks in ops.items()},
        stats=CheckpointStats(
            checkpoint_id=n,
            trigger_time=float(n),
            duration=0.5,
            state_size=0,
            kind=extra.get("kind", "checkpoint"),
        ),
        **extra,
    )


def files_under(fs: StorageFS, directory: str) -> Iterator[str]:
    """Every file under ``directory`` (prefixes are walked, lingering empty ones yield nothing)."""
    for name in fs.listdir(directory):
        path = fs.join(directory, name)
        if fs.exists(path):
            yield path
        else:
            yield from files_under(fs, path)
