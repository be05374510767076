"""How the counting proxy (``tests.s3_proxy``) names a path-style S3 request: as S3 bills
it. Requests pyarrow's client does not make in ``tests/surfaces/test_s3_requests.py``
(Java's and Hadoop's do: ListObjects v1, copies, aborted uploads, bucket settings)."""

from __future__ import annotations

import pytest

from tests.s3_proxy import classify


@pytest.mark.parametrize(
    ("method", "target", "kind"),
    [
        ("GET", "/", "LIST"),  # ListBuckets
        ("GET", "/bucket", "LIST"),  # ListObjects v1, no parameters
        ("GET", "/bucket?list-type=2&prefix=t%2F&delimiter=%2F", "LIST"),
        ("GET", "/bucket/?marker=k&max-keys=1000", "LIST"),
        ("GET", "/bucket?uploads", "LIST"),  # ListMultipartUploads
        ("GET", "/bucket/key.parquet?uploadId=u1", "LIST"),  # ListParts
        ("GET", "/bucket?location", "OTHER"),
        ("GET", "/bucket/ns/t/data/f.parquet", "GET"),
        ("HEAD", "/bucket/ns/t/data/f.parquet", "HEAD"),
        ("HEAD", "/bucket", "HEAD"),
        ("PUT", "/bucket/ns/t/metadata/m.avro", "PUT"),  # PutObject, CopyObject too
        ("PUT", "/bucket/key?partNumber=2&uploadId=u1", "PUT"),  # UploadPart
        ("PUT", "/bucket", "OTHER"),  # CreateBucket
        ("POST", "/bucket/key?uploads", "PUT"),  # CreateMultipartUpload
        ("POST", "/bucket/key?uploadId=u1", "PUT"),  # CompleteMultipartUpload
        ("POST", "/bucket?delete", "DELETE"),  # DeleteObjects
        ("DELETE", "/bucket/key", "DELETE"),
        ("DELETE", "/bucket/key?uploadId=u1", "DELETE"),  # AbortMultipartUpload
        ("DELETE", "/bucket", "OTHER"),  # DeleteBucket
        ("OPTIONS", "/bucket/key", "OTHER"),
    ],
)
def test_each_request_is_named_as_s3_bills_it(method: str, target: str, kind: str) -> None:
    assert classify(method, target) == kind
