"""evaluate_health: each of the five asset checks passes up to its limit and fails beyond it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from icegate_dagster.config import TableSettings, config_from_dict
from icegate_dagster.maintenance.health.checks import (
    CHECK_NAMES,
    METADATA_CHECKS,
    CheckOutcome,
    evaluate_health,
    failing_checks,
    health_score_check,
    metadata_checks,
)
from icegate_dagster.maintenance.results import OpResult, Status, TableResult, TableStats
from icegate_dagster.maintenance.wal import WalStats
from tests.unit.health_builders import summary

MAX_SNAPSHOTS = 3
MAX_WAL_FILES = 10
MAX_WAL_BYTES = 1000
EMPTY_WAL = WalStats(files=0, bytes=0)


@pytest.fixture
def settings(tmp_path: Path) -> TableSettings:
    checks = {
        "max_snapshots": MAX_SNAPSHOTS,
        "max_wal_files": MAX_WAL_FILES,
        "max_wal_bytes": MAX_WAL_BYTES,
    }
    return config_from_dict({"maintain": {"checks": checks}}, tmp_path).defaults


def stats(
    *, rows: int = 100, snapshots: int = 2, small_files: int = 0, compactable_files: int = 0
) -> TableStats:
    return TableStats(
        data_files=4,
        data_bytes=4096,
        small_files=small_files,
        delete_files=0,
        snapshots=snapshots,
        rows=rows,
        manifests=1,
        compactable_files=compactable_files,
    )


def op(
    operation: str,
    status: Status = "completed",
    *,
    details: str = "done",
    error: str | None = None,
    **output: Any,
) -> OpResult:
    return OpResult(
        table="ns.t",
        operation=operation,
        status=status,
        details=details,
        before=None,
        after=None,
        duration_s=0.5,
        output=output,
        error=error,
    )


def result(
    before: TableStats | None,
    after: TableStats | None,
    ops: Iterable[OpResult] = (),
    error: str | None = None,
) -> TableResult:
    return TableResult("ns.t", before, after, list(ops), duration_s=1.0, error=error)


def check(outcomes: list[CheckOutcome], name: str) -> CheckOutcome:
    [outcome] = [o for o in outcomes if o.name == name]
    return outcome


def test_a_healthy_table_passes_all_five_checks_in_contract_order(
    settings: TableSettings,
) -> None:
    outcomes = evaluate_health(result(stats(), stats()), settings, EMPTY_WAL)
    assert [o.name for o in outcomes] == list(CHECK_NAMES[:-1])  # healthy: health_score_check
    assert [o.name for o in outcomes if not o.passed] == []


# rows_preserved ---------------------------------------------------------------------------


@pytest.mark.parametrize(("rows_after", "passed"), [(100, True), (99, False), (101, False)])
def test_rows_preserved_needs_the_exact_count_when_nothing_was_added_or_deleted(
    settings: TableSettings, rows_after: int, passed: bool
) -> None:
    ops = [op("optimize"), op("expire_snapshots", "skipped")]
    outcomes = evaluate_health(
        result(stats(rows=100), stats(rows=rows_after), ops), settings, EMPTY_WAL
    )
    assert check(outcomes, "rows_preserved").passed is passed


@pytest.mark.parametrize(("rows_after", "passed"), [(120, True), (119, False), (121, False)])
def test_rows_preserved_allows_wal_rows_added_and_ttl_rows_deleted(
    settings: TableSettings, rows_after: int, passed: bool
) -> None:
    ops = [
        op("wal_compaction", wal_files_ingested=3, rows_added=30),
        op("optimize"),
        op("retention", rows_deleted=10),
    ]
    outcome = check(
        evaluate_health(result(stats(rows=100), stats(rows=rows_after), ops), settings, EMPTY_WAL),
        "rows_preserved",
    )
    assert outcome.passed is passed
    assert outcome.metadata == {"rows_before": 100, "rows_after": rows_after, "rows_expected": 120}


def test_rows_preserved_sums_rows_added_and_deleted_over_every_op(
    settings: TableSettings,
) -> None:
    ops = [
        op("wal_compaction", rows_added=5),
        op("optimize", rows_added=7),
        op("retention", rows_deleted=2),
        op("remove_orphan_files", rows_deleted=1),
    ]
    outcome = check(
        evaluate_health(result(stats(rows=10), stats(rows=19), ops), settings, EMPTY_WAL),
        "rows_preserved",
    )
    assert outcome.passed
    assert outcome.metadata["rows_expected"] == 19


def test_rows_preserved_fails_without_a_count_from_before_the_pass(
    settings: TableSettings,
) -> None:
    outcome = check(
        evaluate_health(result(None, stats(rows=100)), settings, EMPTY_WAL), "rows_preserved"
    )
    assert not outcome.passed
    assert "could not be read" in outcome.description


def with_deletes(records: int, snapshot_id: int, live: int | None = None) -> TableStats:
    """A table with delete files: ``records`` in its data files, ``live`` counted or not."""
    stats_ = TableStats(
        data_files=4,
        data_bytes=4096,
        small_files=0,
        delete_files=3,
        snapshots=2,
        rows=records,
        manifests=2,
        snapshot_id=snapshot_id,
        position_delete_files=3,
    )
    return stats_ if live is None else stats_.with_live_rows(live)


def test_rows_preserved_compares_live_rows_so_applying_deletes_is_no_loss(
    settings: TableSettings,
) -> None:
    # 110 records with 10 deleted before; the rewrite applied the deletes: 100 records.
    before = with_deletes(records=110, snapshot_id=1, live=100)
    after = stats(rows=100)
    outcome = check(
        evaluate_health(result(before, after, [op("optimize")]), settings, EMPTY_WAL),
        "rows_preserved",
    )
    assert outcome.passed, outcome.description
    assert outcome.metadata == {"rows_before": 100, "rows_after": 100, "rows_expected": 100}


def test_rows_preserved_fails_when_live_rows_were_lost_behind_delete_files(
    settings: TableSettings,
) -> None:
    before = with_deletes(records=110, snapshot_id=1, live=100)
    after = with_deletes(records=110, snapshot_id=2, live=99)
    outcome = check(evaluate_health(result(before, after), settings, EMPTY_WAL), "rows_preserved")
    assert not outcome.passed


def test_live_rows_counted_by_an_operation_reach_the_table_result(
    settings: TableSettings,
) -> None:
    # The pass read its stats before counting; the op counted at the same snapshots.
    counted = OpResult(
        "ns.t",
        "optimize",
        "completed",
        "done",
        with_deletes(records=110, snapshot_id=1, live=100),
        with_deletes(records=105, snapshot_id=2, live=100),
        0.5,
    )
    table = TableResult.from_ops("ns.t", with_deletes(records=110, snapshot_id=1), [counted], 1.0)
    assert table.before is not None and table.before.live_rows == 100
    assert check(evaluate_health(table, settings, EMPTY_WAL), "rows_preserved").passed


def test_rows_preserved_needs_no_count_when_nothing_was_committed(
    settings: TableSettings,
) -> None:
    same = with_deletes(records=110, snapshot_id=7)
    skipped = [op("optimize", "skipped"), op("expire_snapshots", "skipped")]
    outcome = check(
        evaluate_health(result(same, same, skipped), settings, EMPTY_WAL), "rows_preserved"
    )
    assert outcome.passed
    assert "nothing committed" in outcome.description


def test_rows_preserved_fails_when_live_rows_could_not_be_counted(
    settings: TableSettings,
) -> None:
    before, after = with_deletes(110, snapshot_id=1), with_deletes(100, snapshot_id=2)
    ops = [op("optimize", live_rows_error="AnalysisException: snapshot 1 not found")]
    outcome = check(
        evaluate_health(result(before, after, ops), settings, EMPTY_WAL), "rows_preserved"
    )
    assert not outcome.passed
    assert "snapshot 1 not found" in outcome.description


# small_files ------------------------------------------------------------------------------


@pytest.mark.parametrize(("compactable", "passed"), [(0, True), (1, False), (5, False)])
def test_small_files_fails_once_any_small_file_is_still_compactable(
    settings: TableSettings, compactable: int, passed: bool
) -> None:
    # Small files that are not compactable (alone in their partition) do not count.
    after = stats(small_files=3, compactable_files=compactable)
    outcome = check(evaluate_health(result(stats(), after), settings, EMPTY_WAL), "small_files")
    assert outcome.passed is passed
    assert outcome.metadata == {"small_files": 3, "compactable_files": compactable}


def test_small_files_judges_the_state_after_the_pass_not_before(settings: TableSettings) -> None:
    before = stats(small_files=8, compactable_files=8)
    outcome = check(evaluate_health(result(before, stats()), settings, EMPTY_WAL), "small_files")
    assert outcome.passed


# snapshot_count ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("snapshots", "passed"),
    [(1, True), (MAX_SNAPSHOTS, True), (MAX_SNAPSHOTS + 1, False)],
)
def test_snapshot_count_alerts_only_above_max_snapshots(
    settings: TableSettings, snapshots: int, passed: bool
) -> None:
    after = stats(snapshots=snapshots)
    outcome = check(evaluate_health(result(stats(), after), settings, EMPTY_WAL), "snapshot_count")
    assert outcome.passed is passed
    assert outcome.metadata == {"snapshots": snapshots, "max_snapshots": MAX_SNAPSHOTS}


def test_snapshot_count_limit_comes_from_the_settings(tmp_path: Path) -> None:
    roomy = config_from_dict({"maintain": {"checks": {"max_snapshots": 50}}}, tmp_path).defaults
    after = stats(snapshots=MAX_SNAPSHOTS + 1)
    outcome = check(evaluate_health(result(stats(), after), roomy, EMPTY_WAL), "snapshot_count")
    assert outcome.passed


# wal_backlog ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wal", "passed"),
    [
        (WalStats(files=MAX_WAL_FILES, bytes=MAX_WAL_BYTES), True),
        (WalStats(files=MAX_WAL_FILES + 1, bytes=0), False),
        (WalStats(files=1, bytes=MAX_WAL_BYTES + 1), False),
        (WalStats(files=0, bytes=0, quarantined=1), False),
    ],
    ids=["at-both-limits", "one-file-too-many", "one-byte-too-many", "one-quarantined"],
)
def test_wal_backlog_limits_on_files_bytes_and_quarantine(
    settings: TableSettings, wal: WalStats, passed: bool
) -> None:
    outcome = check(evaluate_health(result(stats(), stats()), settings, wal), "wal_backlog")
    assert outcome.passed is passed
    assert outcome.metadata == {
        "wal_files_count": wal.files,
        "wal_size_bytes": wal.bytes,
        "wal_files_quarantined": wal.quarantined,
    }


def test_wal_backlog_names_the_quarantined_files(settings: TableSettings) -> None:
    wal = WalStats(files=0, bytes=0, quarantined=2)
    outcome = check(evaluate_health(result(stats(), stats()), settings, wal), "wal_backlog")
    assert "2 files in quarantine" in outcome.description


# ops_succeeded ----------------------------------------------------------------------------


def test_ops_succeeded_passes_with_completed_and_skipped_ops(settings: TableSettings) -> None:
    ops = [op("optimize"), op("rewrite_manifests", "skipped"), op("expire_snapshots")]
    outcomes = evaluate_health(result(stats(), stats(), ops), settings, EMPTY_WAL)
    outcome = check(outcomes, "ops_succeeded")
    assert outcome.passed
    assert outcome.description == "all 3 operations succeeded"
    assert outcome.metadata == {"failed_ops": [], "errors": []}


def test_ops_succeeded_fails_on_one_failed_op_with_its_error(settings: TableSettings) -> None:
    ops = [
        op("optimize"),
        op("expire_snapshots", "failed", details="failed", error="ValidationException: GC off"),
        op("remove_orphan_files", "skipped"),
    ]
    outcomes = evaluate_health(result(stats(), stats(), ops), settings, EMPTY_WAL)
    outcome = check(outcomes, "ops_succeeded")
    assert not outcome.passed
    assert outcome.metadata["failed_ops"] == ["expire_snapshots"]
    assert outcome.metadata["errors"] == ["expire_snapshots: ValidationException: GC off"]
    assert "ValidationException: GC off" in outcome.description


def test_ops_succeeded_falls_back_to_details_for_a_failure_without_error(
    settings: TableSettings,
) -> None:
    ops = [op("optimize", "failed", details="lost the lease")]
    outcomes = evaluate_health(result(stats(), stats(), ops), settings, EMPTY_WAL)
    outcome = check(outcomes, "ops_succeeded")
    assert outcome.metadata["errors"] == ["optimize: lost the lease"]


def test_ops_succeeded_fails_on_a_table_error_even_without_failed_ops(
    settings: TableSettings,
) -> None:
    outcome = check(
        evaluate_health(result(stats(), stats(), error="table dropped"), settings, EMPTY_WAL),
        "ops_succeeded",
    )
    assert not outcome.passed
    assert outcome.metadata == {"failed_ops": [], "errors": ["table dropped"]}


def test_ops_succeeded_lists_the_table_error_before_op_errors(settings: TableSettings) -> None:
    ops = [op("optimize", "failed", error="boom")]
    outcome = check(
        evaluate_health(result(stats(), stats(), ops, error="cannot read"), settings, EMPTY_WAL),
        "ops_succeeded",
    )
    assert outcome.metadata["errors"] == ["cannot read", "optimize: boom"]
    assert outcome.description == "cannot read; optimize: boom"


# an unreadable table ----------------------------------------------------------------------


def test_an_unreadable_table_fails_the_table_checks_and_still_sizes_its_wal(
    settings: TableSettings,
) -> None:
    ops = [op("optimize", "failed", error="cannot open metadata")]
    unreadable = result(None, None, ops, error="cannot open metadata")
    outcomes = evaluate_health(unreadable, settings, EMPTY_WAL)
    assert [o.name for o in outcomes] == list(CHECK_NAMES[:-1])  # healthy: health_score_check
    for name in ("rows_preserved", "small_files", "snapshot_count"):
        assert not check(outcomes, name).passed, name
        assert check(outcomes, name).description == "the table could not be read"
    assert check(outcomes, "wal_backlog").passed
    assert not check(outcomes, "ops_succeeded").passed


def test_an_unreadable_table_with_a_wal_backlog_fails_wal_backlog_too(
    settings: TableSettings,
) -> None:
    wal = WalStats(files=MAX_WAL_FILES + 1, bytes=0)
    outcomes = evaluate_health(result(None, None, error="gone"), settings, wal)
    assert [o.name for o in outcomes if o.passed] == []


# the checks the health sensor judges from metadata ----------------------------------------


@pytest.mark.parametrize(
    ("figures", "wal", "failing"),
    [
        ({}, EMPTY_WAL, []),
        ({"small_files": 6, "compactable_files": 6}, EMPTY_WAL, ["small_files"]),
        ({"small_files": 6, "compactable_files": 0}, EMPTY_WAL, []),
        ({"snapshots": MAX_SNAPSHOTS + 1}, EMPTY_WAL, ["snapshot_count"]),
        ({}, WalStats(files=MAX_WAL_FILES + 1, bytes=10), ["wal_backlog"]),
        ({}, WalStats(files=1, bytes=10, quarantined=1), ["wal_backlog"]),
    ],
)
def test_the_metadata_checks_judge_a_table_as_a_pass_judges_it(
    settings: TableSettings, figures: dict[str, int], wal: WalStats, failing: list[str]
) -> None:
    """The health sensor's verdicts on a table's figures are the run's on the same figures:
    same names, verdicts and descriptions."""
    now = summary("ns.t", **figures)
    kept = now.figures()
    after = TableStats(
        data_files=kept["data_files"],
        data_bytes=kept["data_bytes"],
        small_files=kept["small_files"],
        delete_files=0,
        snapshots=kept["snapshots"],
        rows=kept["rows"],
        manifests=kept["manifests"],
        compactable_files=kept["compactable_files"],
    )
    sensor = metadata_checks(now, settings, wal, min_score=50.0)
    run = evaluate_health(result(after, after), settings, wal)
    assert [o.name for o in sensor] == list(METADATA_CHECKS)
    assert sensor[0] == health_score_check(now, 50.0)
    for outcome in sensor[1:]:
        assert outcome == check(run, outcome.name)
    assert list(failing_checks(sensor)) == failing


def test_the_metadata_checks_of_an_unreadable_table_fail_with_why(
    settings: TableSettings,
) -> None:
    outcomes = metadata_checks(None, settings, None, min_score=50.0, error="gone: 404")
    assert [(o.name, o.passed) for o in outcomes] == [(n, False) for n in METADATA_CHECKS]
    assert outcomes[0].description == "gone: 404"


def test_a_table_excluded_from_an_operation_passes_the_check_it_would_fix(
    settings: TableSettings,
) -> None:
    base = summary("ns.t", small_files=6, compactable_files=6)
    excluded = dataclasses.replace(base, excluded_operations={"optimize": "left to Amoro"})
    [small] = [
        o
        for o in metadata_checks(excluded, settings, EMPTY_WAL, min_score=50.0)
        if o.name == "small_files"
    ]
    assert small.passed and small.description.startswith("not judged: left to Amoro")
