"""One recursive listing of ``wal.root`` gives every table's WAL exactly as listing each
table's folder does: files, bytes, the oldest file, quarantined files; nothing outside a
table's own folder counts."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from icegate_dagster.maintenance import TableRef
from icegate_dagster.maintenance.wal import (
    RootListing,
    RootListings,
    WalRoot,
    list_wal_files,
    quarantine,
    quarantined_files,
    resolve_wal_root,
    wal_backlogs,
    wal_location,
    wal_stats,
)


def _file(path: Path, size: int, mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    os.utime(path, (mtime, mtime))


def test_one_listing_sizes_every_tables_wal_as_one_listing_per_table_does(
    tmp_path: Path,
) -> None:
    root = tmp_path / "wal"
    _file(root / "lakehouse" / "logs" / "b.parquet", 300, 1000)
    _file(root / "lakehouse" / "logs" / "a.parquet", 200, 1000)  # same time: name decides
    _file(root / "lakehouse" / "logs" / "c.parquet", 100, 900)  # the oldest
    _file(root / "lakehouse" / "logs" / ".in-flight.parquet", 50, 10)  # hidden: not WAL
    _file(root / "lakehouse" / "logs" / "d.parquet.tmp", 50, 10)  # being written
    _file(root / "lakehouse" / "logs" / "_quarantine" / "bad.parquet", 10, 10)
    _file(root / "lakehouse" / "logs" / "_quarantine" / "bad.parquet.reason.txt", 10, 10)
    _file(root / "lakehouse" / "logs" / "nested" / "deeper.parquet", 10, 10)
    _file(root / "lakehouse" / "spans" / "s.parquet", 70, 500)
    _file(root / "other" / "metrics" / "m.parquet", 70, 500)  # a table not asked about
    _file(root / "stray.parquet", 70, 500)
    refs = [TableRef.parse(k) for k in ("lakehouse.logs", "lakehouse.spans", "lakehouse.empty")]

    backlogs, refused = wal_backlogs(resolve_wal_root(root.as_uri()), refs)

    assert refused == {}
    assert backlogs == {ref.key: wal_stats(resolve_wal_root(root.as_uri()), ref) for ref in refs}
    logs = backlogs["lakehouse.logs"]
    assert (logs.files, logs.bytes, logs.oldest, logs.quarantined) == (3, 600, "c.parquet", 1)
    assert backlogs["lakehouse.empty"].files == 0


def test_a_root_that_does_not_exist_yet_is_an_empty_wal(tmp_path: Path) -> None:
    nothing = resolve_wal_root((tmp_path / "nothing").as_uri())
    backlogs, _ = wal_backlogs(nothing, [TableRef.parse("a.b")])
    assert backlogs["a.b"].files == 0


# Names a URI parser would change (issue 37, finding 4): `#` and `?` cut the path there,
# `%xx` is decoded, a space or a non-ASCII letter fails to parse. Each is a legal table name,
# whose WAL folder is that name exactly, beside a folder of the name a parser would make.
_LOOKALIKES = {
    "a#b": "a",
    "a?x=1": "a",
    "a%41": "aA",
    "a b": "a",
    "zähler": "z",
}


@pytest.mark.parametrize("name", list(_LOOKALIKES))
def test_a_wal_folder_is_the_tables_name_exactly_whatever_characters_it_has(
    tmp_path: Path, name: str
) -> None:
    root = tmp_path / "wal"
    own = root / "lakehouse" / name
    decoy = root / "lakehouse" / _LOOKALIKES[name]
    _file(own / "mine-1.parquet", 100, 1000)
    _file(own / "mine-2.parquet", 200, 1001)
    _file(own / "_quarantine" / "bad.parquet", 10, 10)
    _file(decoy / "someone-elses.parquet", 70, 500)
    ref = TableRef("lakehouse", name)

    files = list_wal_files(resolve_wal_root(root.as_uri()), ref)

    assert [f.name for f in files] == ["mine-1.parquet", "mine-2.parquet"]
    assert [Path(f.path) for f in files] == [own / "mine-1.parquet", own / "mine-2.parquet"]
    # Spark is handed the same files: a Hadoop path string is taken literally.
    assert [f.uri for f in files] == [f"file://{own}/mine-1.parquet", f"file://{own}/mine-2.parquet"]
    assert wal_location(root.as_uri(), ref).endswith(f"/lakehouse/{name}")
    stats = wal_stats(resolve_wal_root(root.as_uri()), ref)
    assert (stats.files, stats.bytes, stats.quarantined) == (2, 300, 1)
    # The sensor's one listing of the root agrees with the table's own listing.
    backlogs, refused = wal_backlogs(
        resolve_wal_root(root.as_uri()), [ref, TableRef.parse("lakehouse.other")]
    )
    assert refused == {} and backlogs[ref.key] == stats
    # Quarantining moves the file into the table's own quarantine, nowhere else.
    moved = quarantine(resolve_wal_root(root.as_uri()), ref, files[0], "a test")
    assert Path(moved) == own / "_quarantine" / "mine-1.parquet"
    quarantined = quarantined_files(resolve_wal_root(root.as_uri()), ref)
    assert quarantined == ["bad.parquet", "mine-1.parquet"]
    assert sorted(p.name for p in decoy.iterdir()) == ["someone-elses.parquet"]


def test_a_root_written_with_escapes_is_its_exact_folder_for_pyarrow_and_spark(
    tmp_path: Path,
) -> None:
    """A bare ``wal.root`` path is loaded as a percent-escaped ``file:`` URI: pyarrow decodes
    it, and Spark (Hadoop takes a path string literally) must be given the decoded path."""
    root = tmp_path / "my wal #1 %41 ä"
    own = root / "lakehouse" / "logs"
    _file(own / "x.parquet", 10, 10)
    ref = TableRef.parse("lakehouse.logs")

    [found] = list_wal_files(resolve_wal_root(root.as_uri()), ref)

    assert "%20" in root.as_uri()
    assert (Path(found.path), found.uri) == (own / "x.parquet", f"file://{own}/x.parquet")
    assert wal_backlogs(resolve_wal_root(root.as_uri()), [ref])[0][ref.key].files == 1


def test_a_failed_listing_is_reported_once_and_the_next_wait_lists_again(tmp_path: Path) -> None:
    root = tmp_path / "wal"
    root.write_bytes(b"not a folder")  # listing it fails
    listings = RootListings()
    liveness = time.monotonic() + 60

    with pytest.raises(OSError):
        listings.wait(resolve_wal_root(root.as_uri()), liveness)
    root.unlink()
    _file(root / "lakehouse" / "logs" / "a.parquet", 10, 10)

    listing = listings.wait(resolve_wal_root(root.as_uri()), liveness)
    assert isinstance(listing, RootListing)
    assert listing.folders[("lakehouse", "logs")].files == 1


def _s3_options(root: WalRoot) -> dict[str, object]:
    """The options pyarrow's S3 file system of ``root`` was built with."""
    _rebuild, (options,) = root.filesystem.__reduce__()
    return dict(options)


def test_an_s3_root_is_opened_with_its_storage_properties_never_asking_aws() -> None:
    """``from_uri`` ignored ``s3.endpoint`` and asked AWS for the bucket's region: here the
    endpoint, keys and path style are pyarrow's, and an endpoint with no region gets
    us-east-1 without a request. Spark is handed the same folder as ``s3a://``, names
    exact (escapes of the root decoded once, a table's name joined as it is)."""
    root = resolve_wal_root(
        "s3://wal-bucket/in%20gest",
        {
            "s3.endpoint": "http://127.0.0.1:9",
            "s3.access-key-id": "AKIAUNIT",
            "s3.secret-access-key": "unit-secret",
            "s3.path-style-access": "true",
        },
    )
    options = _s3_options(root)
    assert options["endpoint_override"] == "http://127.0.0.1:9"
    assert (options["access_key"], options["secret_key"]) == ("AKIAUNIT", "unit-secret")
    assert options["region"] == "us-east-1"
    assert options["force_virtual_addressing"] is False
    assert root.path == "wal-bucket/in gest"
    ref = TableRef("lakehouse", "a#b")
    assert root.folder(ref) == "wal-bucket/in gest/lakehouse/a#b"
    assert root.hadoop_folder(ref) == "s3a://wal-bucket/in gest/lakehouse/a#b"
    assert "unit-secret" not in repr(root)
    # Virtual addressing when the path style is turned off; a region given is kept.
    virtual = resolve_wal_root(
        "s3://wal-bucket/x",
        {"s3.endpoint": "https://s3.example", "s3.path-style-access": "false", "s3.region": "eu"},
    )
    assert _s3_options(virtual)["force_virtual_addressing"] is True
    assert _s3_options(virtual)["region"] == "eu"
