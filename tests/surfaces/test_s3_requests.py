"""The counting proxy (``tests.s3_proxy``) between a real S3 client and SeaweedFS's S3:
SigV4-signed requests pass through it unchanged, and each is counted as the kind S3
bills it. ``bench requests`` counts a pass's requests with it."""

from __future__ import annotations

import secrets

from pyarrow import fs

from tests.s3_proxy import DELETED_OBJECTS, KINDS, counting_proxy
from tests.surfaces.seaweedfs_server import (
    REGION,
    SeaweedServer,
    seaweedfs_fixture,  # noqa: F401
)

#: Larger than pyarrow's 10 MiB first part: a multipart upload of two parts.
MULTIPART_BYTES = 12 << 20


def _only(**counts: int) -> dict[str, int]:
    """Every kind's count, zero unless given (no multi-object delete among them)."""
    return {kind: counts.get(kind, 0) for kind in KINDS} | {DELETED_OBJECTS: 0}


def test_signed_requests_pass_through_the_proxy_and_are_counted_by_kind(
    seaweedfs: SeaweedServer,
) -> None:
    bucket = f"counted-{secrets.token_hex(4)}"
    with counting_proxy(seaweedfs.s3_endpoint) as proxy:
        client = fs.S3FileSystem(
            endpoint_override=proxy.endpoint.removeprefix("http://"),
            scheme="http",
            access_key=seaweedfs.access_key,
            secret_key=seaweedfs.secret_key,
            region=REGION,
            force_virtual_addressing=False,
            allow_bucket_creation=True,
        )
        client.create_dir(bucket)
        proxy.counts.take()
        big = secrets.token_bytes(MULTIPART_BYTES)
        with client.open_output_stream(f"{bucket}/d/big.bin") as out:
            out.write(big)
        # CreateMultipartUpload, two parts, CompleteMultipartUpload.
        assert proxy.counts.take() == _only(PUT=4)

        info = client.get_file_info(f"{bucket}/d/big.bin")
        assert info.size == MULTIPART_BYTES
        assert proxy.counts.take() == _only(HEAD=1)

        with client.open_input_file(f"{bucket}/d/big.bin") as source:
            assert source.read_at(1000, 5000) == big[5000:6000]
        assert proxy.counts.take() == _only(HEAD=1, GET=1)

        with client.open_output_stream(f"{bucket}/d/small.bin") as out:
            out.write(b"small")
        proxy.counts.take()
        listed = client.get_file_info(fs.FileSelector(f"{bucket}/d"))
        assert sorted(i.base_name for i in listed) == ["big.bin", "small.bin"]
        assert proxy.counts.take() == _only(LIST=1)

        # One multi-object delete (POST ?delete) naming both objects, after a listing.
        client.delete_dir_contents(f"{bucket}/d")
        counts = proxy.counts.take()
        assert (counts["LIST"], counts["DELETE"], counts[DELETED_OBJECTS]) == (1, 1, 2)
        assert client.get_file_info(fs.FileSelector(f"{bucket}/d", allow_not_found=True)) == []
