"""Hand-built table health for tests that need no table: figures and scores as given."""

from __future__ import annotations

from icegate_dagster.maintenance.health.score import DueOperation, HealthMetrics, TableHealth
from icegate_dagster.maintenance.health.summary import HealthSummary

MB = 1024**2


def metrics(table: str, **figures: int) -> HealthMetrics:
    values = {
        "data_files": 10,
        "data_bytes": 10 * MB,
        "rows": 1000,
        "partitions": 1,
        "small_files": 0,
        "small_bytes": 0,
        "worst_partition_small_files": 0,
        "position_delete_files": 0,
        "equality_delete_files": 0,
        "deletion_vectors": 0,
        "deleted_rows": 0,
        "manifests": 1,
        "small_manifests": 0,
        "snapshots": 3,
        "expirable_snapshots": 0,
        "wal_files": 0,
        "wal_bytes": 0,
    } | figures
    return HealthMetrics(table=table, oldest_snapshot_at=None, **values)  # type: ignore[arg-type]


def health(
    table: str,
    score: float = 100.0,
    due: tuple[str, ...] = (),
    work_bytes: int = 0,
    **figures: int,
) -> TableHealth:
    return TableHealth(
        table=table,
        score=score,
        penalties={"small_files": 100.0 - score},
        due=tuple(DueOperation(op, f"{op} threshold crossed") for op in due),
        metrics=metrics(table, **figures),
        work_bytes=work_bytes,
        thresholds={"min_score": 50.0},
    )


def summary(
    table: str,
    score: float = 100.0,
    due: tuple[str, ...] = (),
    work_bytes: int = 0,
    *,
    min_score: float = 50.0,
    min_interval_s: float = 120.0,
    **figures: int,
) -> HealthSummary:
    """A table's health as the trigger keeps it (see ``health``)."""
    return HealthSummary.of(
        health(table, score, due, work_bytes, **figures), min_score, min_interval_s
    )
