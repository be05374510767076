"""TTL retention deletes exactly the old rows; rollback restores an earlier snapshot."""

import json
from collections import Counter
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest

from icegate_dagster.cli.dispatch import run_cli
from tests.lakehouse import SCHEMA, SPEC, LakehouseFactory


def _rows(start: int, stamp: datetime, count: int) -> pa.Table:
    return pa.Table.from_pydict(
        {
            "id": list(range(start, start + count)),
            "service": ["api"] * count,
            "timestamp": [stamp + timedelta(seconds=i) for i in range(count)],
            "body": [f"row {start + i}" for i in range(count)],
        },
        schema=SCHEMA.as_arrow(),
    )


def test_retention_deletes_exactly_the_rows_older_than_n_days(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory(
        maintain={"retention": {"lakehouse.events": {"days": 30, "column": "timestamp"}}}
    )
    lh.catalog.create_namespace_if_not_exists("lakehouse")
    events = lh.catalog.create_table(("lakehouse", "events"), schema=SCHEMA, partition_spec=SPEC)
    now = datetime.now(UTC)
    events.append(_rows(0, now - timedelta(days=45), 7))  # expired
    events.append(_rows(100, now - timedelta(days=29), 5))  # kept: younger than 30 days
    events.append(_rows(200, now - timedelta(hours=1), 4))  # kept
    lh.add_table("lakehouse.other", appends=1)  # no rule: no retention op
    kept = Counter(r for r in lh.rows("lakehouse.events").elements() if r[0] >= 100)

    assert run_cli(["run", "--config", str(lh.config_path), "--json"]) == 0
    report = {t["table"]: t for t in json.loads(capsys.readouterr().out)["tables"]}

    ops = {op["operation"]: op for op in report["lakehouse.events"]["ops"]}
    assert lh.rows("lakehouse.events") == kept, ops
    assert ops["retention"]["status"] == "completed"
    assert ops["retention"]["output"]["rows_deleted"] == 7
    assert "retention" not in {op["operation"] for op in report["lakehouse.other"]["ops"]}
    [row] = [r for r in lh.log_rows() if r["operation"] == "retention"]
    assert row["table_name"] == "lakehouse.events" and row["status"] == "completed"
    assert "deleted 7 rows" in row["details"]


def test_rollback_restores_the_old_rows(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory()
    table = lh.add_table("lakehouse.orders", appends=2)
    good_snapshot = table.metadata.current_snapshot_id
    good_rows = lh.rows("lakehouse.orders")
    table.append(_rows(9000, datetime.now(UTC), 3))  # a bad write
    assert lh.rows("lakehouse.orders") != good_rows
    config = ["--config", str(lh.config_path), "--json"]

    args = ["rollback", "--table", "lakehouse.orders", "--snapshot-id", str(good_snapshot)]
    assert run_cli([*args, *config]) == 0
    [result] = json.loads(capsys.readouterr().out)["tables"]

    assert result["ops"][0]["status"] == "completed"
    assert lh.rows("lakehouse.orders") == good_rows
    assert lh.table("lakehouse.orders").metadata.current_snapshot_id == good_snapshot
    [row] = [r for r in lh.log_rows() if r["operation"] == "rollback"]
    assert row["status"] == "completed" and row["table_name"] == "lakehouse.orders"

    bad = ["rollback", "--table", "lakehouse.orders", "--snapshot-id", "12345", *config]
    assert run_cli(bad) == 1
    assert "snapshot 12345 is not in the history of lakehouse.orders" in capsys.readouterr().err
    assert lh.rows("lakehouse.orders") == good_rows
