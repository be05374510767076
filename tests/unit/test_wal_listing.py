"""One recursive listing of ``wal.root`` gives every table's WAL exactly as listing each
table's folder does: files, bytes, the oldest file, quarantined files; nothing outside a
table's own folder counts."""

from __future__ import annotations

import os
from pathlib import Path

from icegate_dagster.maintenance import TableRef
from icegate_dagster.maintenance.wal import wal_backlogs, wal_stats


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

    backlogs, refused = wal_backlogs(root.as_uri(), refs)

    assert refused == {}
    assert backlogs == {ref.key: wal_stats(root.as_uri(), ref) for ref in refs}
    logs = backlogs["lakehouse.logs"]
    assert (logs.files, logs.bytes, logs.oldest, logs.quarantined) == (3, 600, "c.parquet", 1)
    assert backlogs["lakehouse.empty"].files == 0


def test_a_root_that_does_not_exist_yet_is_an_empty_wal(tmp_path: Path) -> None:
    backlogs, _ = wal_backlogs((tmp_path / "nothing").as_uri(), [TableRef.parse("a.b")])
    assert backlogs["a.b"].files == 0
