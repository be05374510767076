"""Paths cannot cross (issue 12, item 6): WAL root vs. table folders, WAL names that would
leave their folder, and the overlap guard of orphan removal failing closed. No JVM: every
refusal here happens before Spark would be needed."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from icegate_dagster.cli.dispatch import run_cli
from icegate_dagster.config import load_config
from icegate_dagster.errors import IcegateError
from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.maintenance.discovery import table_locations
from icegate_dagster.maintenance.wal import (
    list_wal_files,
    resolve_wal_root,
    wal_backlogs,
    wal_location,
    wal_stats,
)
from tests.lakehouse import SCHEMA, Lakehouse, LakehouseFactory, batch


def _with_wal_root(lh: Lakehouse, wal_root: str) -> Lakehouse:
    raw = yaml.safe_load(lh.config_path.read_text())
    raw["wal"] = {"root": wal_root}
    lh.config_path.write_text(yaml.safe_dump(raw))
    lh.config = load_config(lh.config_path)
    return lh


@pytest.mark.parametrize(
    ("namespace", "name"),
    [
        ("lakehouse", "a/b"),
        ("lakehouse", "a\\b"),
        ("lakehouse", ".."),
        ("lakehouse", "."),
        ("..", "logs"),
        ("lake/house", "logs"),
        ("lakehouse", "a%2F..%2F..%2Fx"),  # percent-escapes are decoded by URI parsers
        ("lakehouse", "%2E%2E"),
    ],
)
def test_names_that_would_leave_the_wal_folder_are_refused(namespace: str, name: str) -> None:
    ref = TableRef(namespace, name)  # allowed for ordinary maintenance
    with pytest.raises(IcegateError) as raised:
        wal_location("file:///wal", ref)
    message = str(raised.value)
    assert repr(ref.key) in message and "WAL" in message
    with pytest.raises(IcegateError):
        list_wal_files(resolve_wal_root("file:///wal"), ref)
    with pytest.raises(IcegateError):
        wal_stats(resolve_wal_root("file:///wal"), ref)


def test_ordinary_names_keep_their_wal_folder() -> None:
    assert wal_location("file:///wal/", TableRef("lakehouse", "logs.v2")) == (
        "file:///wal/lakehouse/logs.v2"
    )


def test_wal_sensor_lists_nothing_outside_the_wal_root(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory(wal=True)
    # A real WAL file one level above the root: ".." must not reach it.
    outside = lh.root / "lakehouse" / "secret.parquet"
    outside.parent.mkdir(parents=True)
    outside.write_bytes(b"PAR1")
    (lh.root / "wal").mkdir()
    lh.wal_dir("lakehouse.logs")
    assert lh.config.wal_root is not None
    refs = [TableRef("lakehouse", "logs"), TableRef("..", "lakehouse"), TableRef("lakehouse", "..")]
    backlogs, refused = wal_backlogs(resolve_wal_root(lh.config.wal_root), refs)
    assert backlogs == {"lakehouse.logs": wal_stats(resolve_wal_root(lh.config.wal_root), refs[0])}
    assert backlogs["lakehouse.logs"].files == 0  # the file above the root is never counted
    assert sorted(refused) == ["...lakehouse", "lakehouse..."]
    assert all("would not be one folder under wal.root" in why for why in refused.values())


def _wal_inside_table(lakehouse_factory: LakehouseFactory) -> tuple[Lakehouse, str]:
    lh = lakehouse_factory()
    table = lh.add_table("lakehouse.logs", appends=2)
    lh.add_table("lakehouse.spans", appends=1)
    return _with_wal_root(lh, f"{table.location()}/wal"), table.location()


@pytest.mark.parametrize("operation", ["wal_compaction", "remove_orphan_files"])
def test_wal_root_inside_a_table_folder_is_refused_naming_both(
    lakehouse_factory: LakehouseFactory, operation: str
) -> None:
    lh, location = _wal_inside_table(lakehouse_factory)
    maintainer = Maintainer(lh.config, spark=_no_spark)
    result = maintainer.run_op(TableRef.parse("lakehouse.logs"), operation)
    assert result.status == "failed", result
    assert "lakehouse.logs" in result.details
    assert location.removeprefix("file://") in result.details
    assert f"{location}/wal".removeprefix("file://") in result.details
    # The same refusal in a dry run (the plan).
    planned = maintainer.run_op(TableRef.parse("lakehouse.logs"), operation, dry_run=True)
    assert planned.status == "failed" and "wal.root" in planned.details
    # A table elsewhere is not affected.
    other = maintainer.run_op(TableRef.parse("lakehouse.spans"), operation)
    assert other.status == "skipped", other


@pytest.mark.parametrize("table_state", ["gc-disabled", "empty"])
def test_crossing_paths_are_refused_before_any_reason_to_skip(
    lakehouse_factory: LakehouseFactory, table_state: str
) -> None:
    """A misconfiguration is never hidden behind a skip: the refusal comes before the
    gc.enabled and no-snapshot gates."""
    lh = lakehouse_factory()
    if table_state == "empty":
        lh.catalog.create_namespace_if_not_exists("lakehouse")
        table = lh.catalog.create_table(("lakehouse", "empty"), schema=SCHEMA)
        key = "lakehouse.empty"
    else:
        table = lh.add_table("lakehouse.shared", appends=1)
        with table.transaction() as transaction:
            transaction.set_properties({"gc.enabled": "false"})
        key = "lakehouse.shared"
    _with_wal_root(lh, f"{table.location()}/wal")
    result = Maintainer(lh.config, spark=_no_spark).run_op(
        TableRef.parse(key), "remove_orphan_files"
    )
    assert result.status == "failed", result
    assert "wal.root" in result.details and key in result.details


def test_table_folder_inside_the_wal_root_is_refused(lakehouse_factory: LakehouseFactory) -> None:
    lh = lakehouse_factory()
    lh.add_table("lakehouse.logs", appends=1)
    # The warehouse is the WAL root: every table's folder lies inside it.
    _with_wal_root(lh, (lh.root / "warehouse").as_uri())
    result = Maintainer(lh.config, spark=_no_spark).run_op(
        TableRef.parse("lakehouse.logs"), "remove_orphan_files"
    )
    assert result.status == "failed"
    assert "inside wal.root" in result.details or "wal.root" in result.details


class _Unreadable(Exception):
    pass


def test_table_locations_fail_closed_and_include_nested_namespaces(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory()
    lh.add_table("lakehouse.logs", appends=1)
    lh.catalog.create_namespace(("lakehouse", "archive"))
    nested = lh.catalog.create_table(
        ("lakehouse", "archive", "old"), schema=lh.table("lakehouse.logs").schema()
    )
    broken = lh.add_table("lakehouse.broken", appends=1)
    Path(broken.metadata_location.removeprefix("file://")).unlink()

    with pytest.raises(IcegateError) as raised:
        table_locations(lh.catalog)
    assert "lakehouse.broken" in str(raised.value)

    unreadable: dict[str, str] = {}
    locations = table_locations(lh.catalog, unreadable)
    assert set(unreadable) == {"lakehouse.broken"}
    assert "lakehouse.archive.old" in locations
    assert locations["lakehouse.archive.old"].endswith(
        nested.location().removeprefix("file://").rstrip("/")
    )


def test_an_unreadable_table_in_a_folder_apart_does_not_stop_orphan_removal_elsewhere(
    lakehouse_factory: LakehouseFactory,
) -> None:
    """Issue 37: ``lakehouse.broken``'s metadata file is lost; its folder (where that file
    lay) is apart from ``lakehouse.logs``', whose orphan removal goes on as usual: one broken
    table fails on its own, not every table of the catalog with it."""
    lh = lakehouse_factory()
    lh.add_table("lakehouse.logs", appends=2)
    broken = lh.add_table("lakehouse.broken", appends=1)
    broken.append(batch(50, ("api",)))
    Path(broken.metadata_location.removeprefix("file://")).unlink()
    orphan = lh.plant_file("lakehouse.logs", "failed-write.parquet", timedelta(days=30))

    result = Maintainer(lh.config, spark=_no_spark).run_op(
        TableRef.parse("lakehouse.logs"), "remove_orphan_files"
    )
    assert result.status == "completed", result
    assert not orphan.exists()


def test_an_unreadable_tables_folder_is_presumed_only_from_icebergs_layout() -> None:
    from icegate_dagster.maintenance.discovery import presumed_location

    assert presumed_location("s3a://b/wh/ns/t/metadata/00003-x.metadata.json") == "s3://b/wh/ns/t"
    assert presumed_location("file:/w/ns/t/metadata/v1.gz.metadata.json") == "file:///w/ns/t"
    # Elsewhere (write.metadata.path), or not named: its files may lie anywhere.
    assert presumed_location("s3://b/meta/t-1/00003-x.metadata.json") is None
    assert presumed_location("s3://b/metadata/v1.metadata.json") is None
    assert presumed_location(None) is None


def _no_spark() -> object:
    raise AssertionError("this refusal must not need Spark")


def test_all_overlaps_finds_every_overlap_overlapping_tables_finds() -> None:
    from icegate_dagster.maintenance.discovery import (
        all_overlaps,
        normalize_location,
        overlapping_tables,
    )

    locations = {
        "a.outer": "file:///w/outer",
        "a.inner": "file:/w/outer/inner",
        "a.deeper": "/w/outer/inner/deeper",
        "a.twin": "file:///w/outer/",
        "a.sibling": "file:///w/outer-2",  # a common prefix is no overlap
        "a.alone": "s3a://bucket/alone",
        "a.alone_s3": "s3://bucket/alone/x",
    }
    normalized = {key: normalize_location(location) for key, location in locations.items()}
    expected = {
        key: tuple(found)
        for key, location in normalized.items()
        if (found := overlapping_tables(key, location, normalized))
    }
    assert all_overlaps(locations) == expected
    assert "a.sibling" not in expected and set(expected["a.alone"]) == {"a.alone_s3"}


def test_a_refused_wal_name_fails_its_compaction_naming_the_rule_and_deletes_nothing(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory(maintain={"compaction": {"min_files": 1}}, wal=True)
    lh.catalog.create_namespace("lakehouse")
    lh.catalog.create_table(
        ("lakehouse", "%2E%2E"), schema=SCHEMA, location=(lh.root / "w" / "t").as_uri()
    )
    wal = lh.root / "wal"
    waiting = [wal / "lakehouse" / "%2E%2E" / "w.parquet", wal / "x.parquet"]
    for path in waiting:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"PAR1")

    code = run_cli(["compact", "--config", str(lh.config_path), "--table", "lakehouse.%2E%2E"])

    out = capsys.readouterr().out
    assert code == 1
    assert "'lakehouse.%2E%2E'" in out and "is '..' once its %-escapes are decoded" in out
    assert all(path.exists() for path in waiting)
