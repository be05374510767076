"""partition_metadata: the contract's metadata keys on each partition's materialization."""

from __future__ import annotations

from typing import Any

import dagster as dg

from icegate_dagster.assets.partition_events import (
    PARTITION_METADATA,
    exclusion_metadata,
    health_metadata,
    partition_metadata,
)
from icegate_dagster.maintenance import OPERATIONS
from icegate_dagster.maintenance.exclusion import Exclusion
from icegate_dagster.maintenance.health.checks import CheckOutcome
from icegate_dagster.maintenance.results import OpResult, Status, TableResult, TableStats
from icegate_dagster.maintenance.sharing import Sharing
from icegate_dagster.maintenance.wal import WalStats
from tests.contract import CONTRACT_METADATA_KEYS

#: The keys that come from the table's state, left out when it could not be read.
STATE_KEYS = tuple(k for k in CONTRACT_METADATA_KEYS if k.endswith(("_before", "_after"))) + (
    "small_files_after",
)

BEFORE = TableStats(
    data_files=8,
    data_bytes=8000,
    small_files=6,
    delete_files=0,
    snapshots=9,
    rows=100,
    manifests=8,
    compactable_files=6,
)
AFTER = TableStats(
    data_files=2,
    data_bytes=7000,
    small_files=1,
    delete_files=0,
    snapshots=3,
    rows=130,
    manifests=1,
    compactable_files=0,
)
WAL = WalStats(files=7, bytes=2048, quarantined=1)


def op(
    operation: str,
    status: Status = "completed",
    duration_s: float = 1.0,
    details: str = "done",
    **output: Any,
) -> OpResult:
    return OpResult(
        table="ns.t",
        operation=operation,
        status=status,
        details=details,
        before=BEFORE,
        after=AFTER,
        duration_s=duration_s,
        output=output,
        error="boom" if status == "failed" else None,
    )


def maintained(*ops: OpResult, error: str | None = None) -> TableResult:
    return TableResult("ns.t", BEFORE, AFTER, list(ops), duration_s=12.34567, error=error)


def markdown_cells(metadata: dict[str, Any]) -> list[list[str]]:
    """The ``ops`` markdown table as rows of stripped cells, header first, rule left out."""
    value = metadata["ops"]
    assert isinstance(value, dg.MarkdownMetadataValue)
    assert value.md_str is not None
    lines = value.md_str.splitlines()
    assert all(line.startswith("|") and line.endswith("|") for line in lines), lines
    rows = [[cell.strip() for cell in line[1:-1].split("|")] for line in lines]
    assert rows[1] and all(set(cell) <= set("-:") and cell for cell in rows[1]), rows[1]
    return [rows[0], *rows[2:]]


OPS_HEADER = ["operation", "status", "time", "data files", "details"]


def test_every_contract_key_is_present_with_the_table_numbers() -> None:
    metadata = partition_metadata(maintained(op("optimize")), WAL)
    assert {key: metadata[key] for key in CONTRACT_METADATA_KEYS} == {
        "files_before": 8,
        "files_after": 2,
        "bytes_before": 8000,
        "bytes_after": 7000,
        "snapshots_before": 9,
        "snapshots_after": 3,
        "rows_before": 100,
        "rows_after": 130,
        "wal_files_ingested": 0,
        "orphans_removed": 0,
        "duration_s": 12.346,
    }
    assert metadata["small_files_after"] == 1


def test_wal_state_is_reported_as_given() -> None:
    metadata = partition_metadata(maintained(), WAL)
    assert metadata["wal_files_count"] == 7
    assert metadata["wal_size_bytes"] == 2048
    assert metadata["wal_files_quarantined"] == 1


def test_wal_files_ingested_and_orphans_removed_are_summed_over_ops() -> None:
    result = maintained(
        op("wal_compaction", wal_files_ingested=3, rows_added=30),
        op("wal_compaction", wal_files_ingested=4, rows_added=40),
        op("remove_orphan_files", orphans_removed=5),
        op("remove_orphan_files", orphans_removed=6),
        op("optimize"),
    )
    metadata = partition_metadata(result, WAL)
    assert metadata["wal_files_ingested"] == 7
    assert metadata["orphans_removed"] == 11


def test_ops_failed_counts_only_failed_ops() -> None:
    result = maintained(
        op("optimize", "failed"),
        op("rewrite_manifests", "skipped"),
        op("expire_snapshots", "failed"),
        op("remove_orphan_files"),
    )
    assert partition_metadata(result, WAL)["ops_failed"] == 2
    assert partition_metadata(maintained(op("optimize")), WAL)["ops_failed"] == 0


def test_each_op_has_its_status_and_rounded_duration() -> None:
    result = maintained(
        op("optimize", "completed", duration_s=1.23456),
        op("expire_snapshots", "skipped", duration_s=0.0004),
        op("retention", "failed", duration_s=2.5),
    )
    metadata = partition_metadata(result, WAL)
    assert metadata["optimize_status"] == "completed"
    assert metadata["optimize_duration_s"] == 1.235
    assert metadata["expire_snapshots_status"] == "skipped"
    assert metadata["expire_snapshots_duration_s"] == 0.0
    assert metadata["retention_status"] == "failed"
    assert metadata["retention_duration_s"] == 2.5
    # Operations that did not run have no keys.
    assert "rewrite_manifests_status" not in metadata
    assert "wal_compaction_duration_s" not in metadata


def test_an_unreadable_table_leaves_out_its_unknown_numbers() -> None:
    failed = OpResult("ns.t", "optimize", "failed", "failed", None, None, 0.0, error="gone")
    result = TableResult("ns.t", None, None, [failed], duration_s=0.5, error="cannot open")
    metadata = partition_metadata(result, WalStats(0, 0))
    assert [key for key in STATE_KEYS if key in metadata] == []
    assert None not in metadata.values()
    assert metadata["error"] == "cannot open"
    assert metadata["ops_failed"] == 1
    assert metadata["optimize_status"] == "failed"
    assert (metadata["wal_files_ingested"], metadata["orphans_removed"]) == (0, 0)
    assert metadata["duration_s"] == 0.5
    assert markdown_cells(metadata)[1] == ["optimize", "failed", "0.0s", "? → ?", "failed"]


def test_a_table_read_only_after_the_pass_reports_only_the_after_numbers() -> None:
    result = TableResult("ns.t", None, AFTER, [op("optimize")], duration_s=1.0)
    metadata = partition_metadata(result, WAL)
    assert "files_before" not in metadata and "rows_before" not in metadata
    assert metadata["files_after"] == 2 and metadata["rows_after"] == 130


def test_no_error_key_when_the_table_had_no_error() -> None:
    assert "error" not in partition_metadata(maintained(op("optimize")), WAL)


def test_ops_table_has_one_row_per_op_with_files_before_and_after() -> None:
    result = maintained(
        op("optimize", details="rewrote 8 data files into 2", duration_s=1.26),
        op("expire_snapshots", "skipped", details="nothing to expire"),
    )
    assert markdown_cells(partition_metadata(result, WAL)) == [
        OPS_HEADER,
        ["optimize", "completed", "1.3s", "8 → 2", "rewrote 8 data files into 2"],
        ["expire_snapshots", "skipped", "1.0s", "8 → 2", "nothing to expire"],
    ]


def test_a_pipe_in_details_does_not_add_a_column_to_the_ops_table() -> None:
    result = maintained(op("optimize", "failed", details="a | b || c"))
    header, row = markdown_cells(partition_metadata(result, WAL))
    assert header == OPS_HEADER
    assert len(row) == len(OPS_HEADER)
    assert row[-1] == "a / b // c"


def test_ops_json_holds_every_op_in_order() -> None:
    result = maintained(op("optimize", orphans_removed=0), op("retention", rows_deleted=3))
    value = partition_metadata(result, WAL)["ops_json"]
    assert isinstance(value, dg.JsonMetadataValue)
    assert value.data == [r.as_dict() for r in result.ops]
    assert [entry["operation"] for entry in value.data] == ["optimize", "retention"]
    assert value.data[1]["output"] == {"rows_deleted": 3}


def _documented(key: str) -> bool:
    """``key`` is in PARTITION_METADATA, itself or as ``<operation>_...``."""
    if key in PARTITION_METADATA:
        return True
    return any(
        key == f"{name}{pattern.removeprefix('<operation>')}"
        for name in OPERATIONS.names()
        for pattern in PARTITION_METADATA
        if pattern.startswith("<operation>")
    )


def test_every_metadata_key_a_partition_gets_is_documented() -> None:
    """PARTITION_METADATA (which the documentation's Dagster reference lists) names every key
    a maintenance pass, an exclusion, a shared location and a health verdict put on a
    partition, so a new key cannot go undocumented."""
    result = maintained(
        *(op(name, tables_consulted=["ns.twin"]) for name in OPERATIONS.names()),
        error="the table vanished",
    )
    verdict = CheckOutcome("healthy", False, "could not be assessed")
    metadata = {
        **partition_metadata(result, WAL),
        **health_metadata(None, verdict),
        **exclusion_metadata(
            Exclusion(table="excluded by the configuration", by="config"),
            Sharing("ns.t", "file:///w/t", overlapping=("ns.twin",)),
        ),
    }
    assert {"tables_consulted", "error", "excluded", "sharing_warning"} <= set(metadata)
    assert [key for key in metadata if not _documented(key)] == []
    # The contract's keys among them.
    assert all(_documented(key) for key in CONTRACT_METADATA_KEYS)
