"""The WAL record and the runs that need no Spark: nothing to ingest, below the thresholds,
and the leftovers of a commit whose deletes never happened (no JVM starts for any of them).

Real pyiceberg tables in a SQLite ``SqlCatalog`` and real WAL files in a temporary folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NoReturn

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField

from icegate_dagster.config import CompactionSettings
from icegate_dagster.maintenance.identifiers import TableRef
from icegate_dagster.maintenance.wal import (
    FILES_PROPERTY,
    LEDGER_PROPERTY,
    committed_wal_files,
    compact_wal,
    list_wal_files,
    resolve_wal_root,
    settle_committed,
)

REF = TableRef("lakehouse", "logs")
SCHEMA = Schema(NestedField(1, "id", LongType(), required=False))
RULE = CompactionSettings(min_files=4, min_size_bytes=100 * 1024**2)


def no_spark() -> NoReturn:
    raise AssertionError("Spark must not start")


@pytest.fixture
def table(tmp_path: Path) -> Table:
    folder = tmp_path / "catalog"
    folder.mkdir()
    catalog = SqlCatalog(
        "unit", uri=f"sqlite:///{folder / 'catalog.db'}", warehouse=folder.as_uri()
    )
    catalog.create_namespace(REF.namespace)
    return catalog.create_table(REF.identifier, schema=SCHEMA)


@pytest.fixture
def wal_root(tmp_path: Path) -> str:
    return (tmp_path / "wal").as_uri()


def _rows(*ids: int) -> pa.Table:
    return pa.Table.from_pydict({"id": list(ids)}, schema=SCHEMA.as_arrow())


def _wal_file(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "wal" / REF.namespace / REF.name
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(_rows(1, 2), folder / name)


def _record(*identities: tuple[str, int, int]) -> str:
    return json.dumps(sorted(list(i) for i in identities), separators=(",", ":"))


def test_no_wal_root_no_work(table: Table) -> None:
    outcome = compact_wal(no_spark, "lakehouse", REF, table, None, RULE)
    assert (outcome.status, outcome.details, outcome.output) == (
        "skipped",
        "no wal.root configured",
        {},
    )


def test_an_empty_wal_is_skipped(table: Table, wal_root: str) -> None:
    outcome = compact_wal(
        no_spark, "lakehouse", REF, table, resolve_wal_root(wal_root), RULE, force=True
    )
    assert outcome.status == "skipped"
    assert outcome.details == f"no WAL files waiting in {wal_root}/lakehouse/logs"
    assert outcome.output == {
        "wal_files_ingested": 0,
        "rows_added": 0,
        "wal_files_recovered": 0,
        "quarantined": [],
        "wal_files_pending": 0,
        "wal_bytes_pending": 0,
    }


def test_a_wal_below_its_thresholds_waits(tmp_path: Path, table: Table, wal_root: str) -> None:
    _wal_file(tmp_path, "a.parquet")
    size = list_wal_files(resolve_wal_root(wal_root), REF)[0].size

    outcome = compact_wal(no_spark, "lakehouse", REF, table, resolve_wal_root(wal_root), RULE)

    assert outcome.status == "skipped"
    assert outcome.details == (
        f"WAL below thresholds: 1 files, {size} bytes (runs at 4 files or 104857600 bytes)"
    )
    assert outcome.output["wal_files_pending"] == 1
    assert outcome.output["wal_bytes_pending"] == size
    assert [f.name for f in list_wal_files(resolve_wal_root(wal_root), REF)] == ["a.parquet"]


def test_the_record_is_the_ledger_and_the_main_branch_summaries(
    tmp_path: Path, table: Table, wal_root: str
) -> None:
    _wal_file(tmp_path, "a.parquet")
    _wal_file(tmp_path, "b.parquet")
    a, b = (f.identity for f in list_wal_files(resolve_wal_root(wal_root), REF))
    table.append(_rows(1, 2), snapshot_properties={FILES_PROPERTY: _record(a)})
    with table.transaction() as transaction:
        transaction.set_properties({LEDGER_PROPERTY: _record(b)})
    assert committed_wal_files(table) == {a, b}

    # Another file of the same name (a new modification time) is not the committed one.
    assert (a[0], a[1], a[2] + 1) not in committed_wal_files(table)


def test_a_damaged_record_records_nothing(table: Table) -> None:
    with table.transaction() as transaction:
        transaction.set_properties({LEDGER_PROPERTY: "{not json"})
    table.append(_rows(1), snapshot_properties={FILES_PROPERTY: '[["x", "size", 0]]'})
    assert committed_wal_files(table) == set()


def test_leftovers_of_a_commit_are_deleted_not_ingested_again(
    tmp_path: Path, table: Table, wal_root: str
) -> None:
    """A crash between a WAL commit and its deletes: the next run deletes those files and
    completes, though nothing new is ingested (and so Spark never starts)."""
    _wal_file(tmp_path, "a.parquet")
    _wal_file(tmp_path, "b.parquet")
    committed = next(
        f.identity for f in list_wal_files(resolve_wal_root(wal_root), REF) if f.name == "a.parquet"
    )
    with table.transaction() as transaction:
        transaction.set_properties({LEDGER_PROPERTY: _record(committed)})

    outcome = compact_wal(no_spark, "lakehouse", REF, table, resolve_wal_root(wal_root), RULE)

    assert outcome.status == "completed"
    assert outcome.details.endswith("; deleted 1 WAL files an earlier commit already holds")
    assert outcome.output["wal_files_recovered"] == 1
    assert outcome.output["wal_files_pending"] == 1
    assert [f.name for f in list_wal_files(resolve_wal_root(wal_root), REF)] == ["b.parquet"]
    assert settle_committed(table, resolve_wal_root(wal_root), REF) == 0  # nothing left to settle
