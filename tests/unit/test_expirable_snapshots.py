"""expirable_snapshots: the metadata-only plan of an expiry, on real pyiceberg tables (no JVM).

It must count what Iceberg's ``expire_snapshots(older_than, retain_last)`` would remove:
snapshots strictly older than the cutoff, except the last ``retain_last`` ancestors of
the current snapshot and every branch and tag head.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from pyiceberg.table import Table

from icegate_dagster.config import ExpireSnapshotsSettings, config_from_dict
from icegate_dagster.maintenance.ops.expire_snapshots import expirable_snapshots
from tests.unit.pyiceberg_tables import create_table, instant, rows, sqlite_catalog

THRESHOLD = timedelta(days=7)
SNAPSHOTS = 5


def expire_settings(tmp_path: Path, retain_last: int = 1) -> ExpireSnapshotsSettings:
    block = {"retention_threshold": "7d", "retain_last": retain_last}
    config = config_from_dict({"maintain": {"expire_snapshots": block}}, tmp_path)
    return config.defaults.expire_snapshots


def now_with_cutoff_at(timestamp_ms: int) -> datetime:
    """The ``now`` whose cutoff (``now - 7d``) is exactly ``timestamp_ms``."""
    return instant(timestamp_ms) + THRESHOLD


@pytest.fixture
def table(tmp_path: Path) -> Table:
    """Five snapshots on main, s0 (oldest) to s4 (current)."""
    return create_table(sqlite_catalog(tmp_path / "lake"), "events", appends=SNAPSHOTS)


def stamps(table: Table) -> list[int]:
    return [s.timestamp_ms for s in table.metadata.snapshots]


def ids(table: Table) -> list[int]:
    return [s.snapshot_id for s in table.metadata.snapshots]


def after_all(table: Table) -> datetime:
    return now_with_cutoff_at(max(stamps(table)) + 1)


def test_the_fixture_is_one_line_of_history(table: Table) -> None:
    snapshots = table.metadata.snapshots
    assert [s.parent_snapshot_id for s in snapshots] == [None, *ids(table)[:-1]]
    assert table.current_snapshot() == snapshots[-1]


def test_nothing_expires_when_the_cutoff_precedes_every_snapshot(
    table: Table, tmp_path: Path
) -> None:
    now = now_with_cutoff_at(min(stamps(table)) - 1)
    assert expirable_snapshots(table, expire_settings(tmp_path), now) == 0


def test_a_snapshot_exactly_at_the_cutoff_is_not_older_than_it(
    table: Table, tmp_path: Path
) -> None:
    now = now_with_cutoff_at(min(stamps(table)))
    assert expirable_snapshots(table, expire_settings(tmp_path), now) == 0


@pytest.mark.parametrize("index", [1, 2, 3])
def test_only_snapshots_strictly_older_than_the_cutoff_are_counted(
    table: Table, tmp_path: Path, index: int
) -> None:
    settings = expire_settings(tmp_path)
    at = stamps(table)[index]
    assert expirable_snapshots(table, settings, now_with_cutoff_at(at)) == index
    assert expirable_snapshots(table, settings, now_with_cutoff_at(at + 1)) == index + 1


def test_every_snapshot_but_the_current_expires_when_the_cutoff_follows_them_all(
    table: Table, tmp_path: Path
) -> None:
    assert expirable_snapshots(table, expire_settings(tmp_path), after_all(table)) == SNAPSHOTS - 1


def test_the_cutoff_is_now_minus_the_retention_threshold(table: Table, tmp_path: Path) -> None:
    s3 = instant(stamps(table)[3])
    settings = expire_settings(tmp_path)
    # Seven days after s3, s3 is exactly at the cutoff; one ms later it is past it.
    assert expirable_snapshots(table, settings, s3 + THRESHOLD) == 3
    one_ms = timedelta(milliseconds=1)
    assert expirable_snapshots(table, settings, s3 + THRESHOLD + one_ms) == 4
    # Six days after, nothing is old enough.
    assert expirable_snapshots(table, settings, s3 + timedelta(days=6)) == 0


@pytest.mark.parametrize(
    ("retain_last", "expected"),
    [(1, 4), (2, 3), (4, 1), (SNAPSHOTS, 0), (SNAPSHOTS + 3, 0)],
)
def test_retain_last_protects_the_newest_ancestors_of_the_current_snapshot(
    table: Table, tmp_path: Path, retain_last: int, expected: int
) -> None:
    settings = expire_settings(tmp_path, retain_last)
    assert expirable_snapshots(table, settings, after_all(table)) == expected


def test_retain_last_overlapping_young_snapshots_protects_no_extra(
    table: Table, tmp_path: Path
) -> None:
    # Cutoff at s3: s0..s2 are old; retain_last=2 protects s4 and s3, both young already.
    now = now_with_cutoff_at(stamps(table)[3])
    assert expirable_snapshots(table, expire_settings(tmp_path, retain_last=2), now) == 3


def test_a_tag_head_is_never_counted(table: Table, tmp_path: Path) -> None:
    table.manage_snapshots().create_tag(ids(table)[0], "first-load").commit()
    assert expirable_snapshots(table, expire_settings(tmp_path), after_all(table)) == SNAPSHOTS - 2


def test_a_branch_head_is_never_counted(table: Table, tmp_path: Path) -> None:
    table.manage_snapshots().create_branch(ids(table)[1], "audit").commit()
    assert expirable_snapshots(table, expire_settings(tmp_path), after_all(table)) == SNAPSHOTS - 2


def test_a_branch_with_its_own_commit_keeps_its_head_but_not_main_history(
    table: Table, tmp_path: Path
) -> None:
    main_ids = ids(table)
    table.manage_snapshots().create_branch(main_ids[1], "audit").commit()
    table.append(rows(99), branch="audit")
    head = table.metadata.refs["audit"].snapshot_id
    assert head not in main_ids
    # s0..s3 expire (s1 is now an ancestor only); s4 (main) and the branch head stay.
    assert expirable_snapshots(table, expire_settings(tmp_path), after_all(table)) == 4


def test_tags_and_branches_on_one_snapshot_protect_it_once(table: Table, tmp_path: Path) -> None:
    snapshot = ids(table)[2]
    table.manage_snapshots().create_tag(snapshot, "t1").create_tag(snapshot, "t2").commit()
    table.manage_snapshots().create_branch(snapshot, "b").commit()
    assert expirable_snapshots(table, expire_settings(tmp_path), after_all(table)) == SNAPSHOTS - 2


def test_a_table_without_snapshots_has_nothing_to_expire(tmp_path: Path) -> None:
    empty = create_table(sqlite_catalog(tmp_path / "lake"), "empty")
    now = now_with_cutoff_at(10**13)
    assert expirable_snapshots(empty, expire_settings(tmp_path), now) == 0


def test_retain_last_also_protects_ancestors_of_other_branches_like_iceberg(
    table: Table, tmp_path: Path
) -> None:
    s = ids(table)
    table.manage_snapshots().create_branch(s[1], "audit").commit()
    # Iceberg keeps s4, s3 (main) and s1, s0 (audit) with retain_last=2: only s2 expires.
    settings = expire_settings(tmp_path, retain_last=2)
    assert expirable_snapshots(table, settings, after_all(table)) == 1


def test_a_tag_past_its_max_ref_age_protects_nothing_like_iceberg(
    table: Table, tmp_path: Path
) -> None:
    table.manage_snapshots().create_tag(ids(table)[0], "short-lived", max_ref_age_ms=1).commit()
    time.sleep(0.01)  # the tag is now older than its 1 ms max age
    settings = expire_settings(tmp_path, retain_last=SNAPSHOTS - 1)
    # retain_last keeps s1..s4; the expired tag keeps nothing: Iceberg expires s0.
    assert expirable_snapshots(table, settings, after_all(table)) == 1
