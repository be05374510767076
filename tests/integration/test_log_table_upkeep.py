"""The log table does not rot: every pass appends to it, and every pass keeps it bounded."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pyarrow as pa

from icegate_dagster.maintenance import Maintainer
from icegate_dagster.maintenance.log.upkeep import (
    LOG_TABLE_SMALL_FILES,
    LOG_TABLE_SNAPSHOTS,
)
from icegate_dagster.maintenance.log.writer import ensure_log_table, log_size
from tests.lakehouse import LakehouseFactory

RUNS = 60  # three compaction groups and expiries: bounded across cycles


def test_many_small_appends_leave_bounded_files_and_snapshots_and_every_row(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory()
    maintainer = Maintainer(lh.config)
    ref = maintainer.log_table
    ensure_log_table(lh.catalog, ref)
    schema = lh.catalog.load_table(ref.identifier).schema().as_arrow()
    worst_files = worst_snapshots = 0
    started = time.monotonic()
    for run in range(RUNS):
        # What each run leaves behind: one small append of its log rows...
        row = {
            "table_name": "lakehouse.logs",
            "operation": "optimize",
            "status": "skipped",
            "details": f"run {run}",
            "duration_ms": run,
            "run_id": f"run-{run}",
            "executed_at": datetime.now(UTC),
        }
        lh.catalog.load_table(ref.identifier).append(pa.Table.from_pylist([row], schema=schema))
        # ...then the pass's upkeep of the log table.
        upkeep = maintainer.maintain_log_table()
        assert all(op.status != "failed" for op in upkeep), [op.details for op in upkeep]
        table = lh.catalog.load_table(ref.identifier)
        files = len(table.inspect.files())
        worst_files = max(worst_files, files)
        worst_snapshots = max(worst_snapshots, len(table.metadata.snapshots))
    print(f"{RUNS} runs in {time.monotonic() - started:.1f}s")

    # Bounded however many runs: files by the compaction group, snapshots by expiry.
    assert worst_files <= LOG_TABLE_SMALL_FILES + 1
    assert worst_snapshots <= 2 * LOG_TABLE_SNAPSHOTS + 3
    # Nothing lost on the way.
    assert log_size(lh.catalog, ref) == RUNS
    details = lh.catalog.load_table(ref.identifier).scan().to_arrow().column("details")
    assert sorted(details.to_pylist()) == sorted(f"run {i}" for i in range(RUNS))
