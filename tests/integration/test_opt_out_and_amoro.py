"""Issue 28, item 3, through a real pass: a namespace excluded by the configuration, an
Amoro-owned table whose rewrites are left to Amoro (the rest maintained), and one whose
``defer_to_amoro: false`` has it rewritten here. Tables written by pyiceberg; rows read
back by Spark and DuckDB."""

from __future__ import annotations

import functools
import json
import time
from collections import Counter
from typing import Any

import pytest

from icegate_dagster.cli.dispatch import run_cli
from icegate_dagster.maintenance import TableRef
from icegate_dagster.spark.session import get_spark
from tests.duckdb_reader import duckdb_iceberg
from tests.lakehouse import Lakehouse, LakehouseFactory

AMORO = "lakehouse.amoro"
MINE = "lakehouse.mine"
ARCHIVED = "archive.old"


@functools.cache
def _duckdb() -> Any:
    return duckdb_iceberg()


def _rows(lh: Lakehouse, key: str) -> Counter[tuple[Any, ...]]:
    """The table's rows read by Spark, checked against DuckDB's reading."""
    name = TableRef.parse(key).spark_identifier(lh.config.catalog.name)
    spark = Counter(
        tuple(r) for r in get_spark(lh.config).sql(f"SELECT id, service FROM {name}").collect()
    )
    query = "SELECT id, service FROM iceberg_scan(?)"
    duck = _duckdb().execute(query, [lh.table(key).metadata_location]).fetchall()
    assert Counter(tuple(r) for r in duck) == spark, key
    return spark


def test_excluded_and_amoro_owned_tables_in_a_full_pass(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory(
        maintain={
            "expire_snapshots": {"retention_threshold": "1s"},
            "tables": {"archive.*": {"enabled": False}, MINE: {"defer_to_amoro": False}},
        }
    )
    for key in (AMORO, MINE, ARCHIVED):
        table = lh.add_table(key, appends=6)
        if key != ARCHIVED:
            table.transaction().set_properties(
                {"self-optimizing.enabled": "true"}
            ).commit_transaction()
    time.sleep(1.1)
    rows = {key: _rows(lh, key) for key in (AMORO, MINE, ARCHIVED)}
    archived = lh.table(ARCHIVED).metadata_location

    code = run_cli(["run", "--config", str(lh.config_path), "--json"])

    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    ops = {t["table"]: {o["operation"]: o for o in t["ops"]} for t in report["tables"]}
    # Excluded by the configuration: every operation skipped, saying why; nothing changed.
    assert all(o["status"] == "skipped" for o in ops[ARCHIVED].values())
    assert all(
        "excluded from maintenance by the configuration" in o["details"]
        for o in ops[ARCHIVED].values()
    )
    assert lh.table(ARCHIVED).metadata_location == archived
    # Owned by Amoro: no rewrite here, the rest maintained.
    for rewrite in ("optimize", "rewrite_position_delete_files"):
        assert ops[AMORO][rewrite]["status"] == "skipped"
        assert "left to Apache Amoro" in ops[AMORO][rewrite]["details"]
    assert ops[AMORO]["expire_snapshots"]["status"] == "completed"
    assert len(lh.data_file_paths(AMORO)) == 12 and len(lh.table(AMORO).metadata.snapshots) == 1
    # defer_to_amoro: false: compacted here as any table.
    assert ops[MINE]["optimize"]["status"] == "completed"
    assert len(lh.data_file_paths(MINE)) == 2
    assert {key: _rows(lh, key) for key in rows} == rows
