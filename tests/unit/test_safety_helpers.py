"""Pure safety helpers: which failures are retried, which locations overlap."""

from __future__ import annotations

import pytest

from icegate_dagster.maintenance.discovery import normalize_location, overlapping_tables
from icegate_dagster.maintenance.ops.procedures import is_commit_conflict


@pytest.mark.parametrize(
    ("message", "retried"),
    [
        ("org.apache.iceberg.exceptions.CommitFailedException: Version 3 already exists", True),
        ("org.apache.iceberg.exceptions.ValidationException: Found conflicting files", True),
        ("org.apache.iceberg.exceptions.CommitStateUnknownException: CommitFailedException", False),
        ("java.io.FileNotFoundException: File does not exist: x.parquet", False),
    ],
)
def test_only_lost_commit_races_are_retried(message: str, retried: bool) -> None:
    assert is_commit_conflict(RuntimeError(message)) is retried


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("file:/wh/db/t", "file:///wh/db/t/"),
        ("/wh/db/t", "file:///wh/db/t"),
        ("s3a://bucket/wh/t", "s3://bucket/wh/t"),
        ("s3n://bucket/wh/t/", "s3://bucket/wh/t"),
    ],
)
def test_spellings_of_one_place_normalize_alike(a: str, b: str) -> None:
    assert normalize_location(a) == normalize_location(b)


def test_overlap_is_by_folder_not_by_prefix() -> None:
    locations = {
        "ns.t": "file:///wh/ns/t",
        "ns.t_archive": "file:///wh/ns/t_archive",
        "ns.inner": "file:///wh/ns/t/inner",
        "ns.parent": "file:///wh/ns",
    }
    assert overlapping_tables("ns.t", "file:/wh/ns/t/", locations) == ["ns.inner", "ns.parent"]
    assert overlapping_tables("ns.t_archive", "/wh/ns/t_archive", locations) == ["ns.parent"]
