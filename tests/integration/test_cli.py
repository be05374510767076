"""The CLI as a user runs it: discovery, status, exit codes, the demo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from icegate_dagster.cli.dispatch import run_cli
from tests.lakehouse import LakehouseFactory


def test_discover_and_status(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory()
    lh.add_table("lakehouse.logs", appends=6, services=("api", "web"))
    lh.add_table("lakehouse._maintenance_log", appends=1)
    lh.add_table("other.metrics", appends=2)
    config = ["--config", str(lh.config_path), "--json"]

    assert run_cli(["discover", *config]) == 0
    assert json.loads(capsys.readouterr().out) == ["lakehouse.logs", "other.metrics"]

    assert run_cli(["status", "--table", "lakehouse.logs", *config]) == 0
    [status] = json.loads(capsys.readouterr().out)
    table = lh.table("lakehouse.logs")
    assert status["stats"]["data_files"] == 12 == len(table.inspect.files())
    assert status["stats"]["snapshots"] == 6
    assert status["stats"]["rows"] == 60
    assert status["stats"]["compactable_files"] == 12  # 6 small files in each partition


def test_discovery_leaves_out_the_log_table_whatever_its_name(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory(maintain={"log_table": "lakehouse.maintenance_log"})
    lh.add_table("lakehouse.logs", appends=1)
    lh.add_table("lakehouse.maintenance_log", appends=1)
    # Beside a log table named without "_", the orphan candidates live in orphan_candidates.
    lh.add_table("lakehouse.orphan_candidates", appends=1)

    assert run_cli(["discover", "--config", str(lh.config_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == ["lakehouse.logs"]


def test_unknown_table_fails_clearly(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory()
    lh.add_table("lakehouse.logs", appends=1)
    code = run_cli(["optimize", "--table", "lakehouse.nope", "--config", str(lh.config_path)])
    out = capsys.readouterr().out
    assert code == 1
    assert "table 'lakehouse.nope' does not exist" in out


def test_bad_config_exits_2_naming_key_and_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "icegate.yaml"
    path.write_text("maintain:\n  expire_snapshots:\n    retain_last: 0\n")
    assert run_cli(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "maintain.expire_snapshots.retain_last = 0" in err


def test_bad_usage_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run_cli(["optimize"])  # --table is required
    assert info.value.code == 2


def test_dry_run_changes_nothing_and_logs_nothing(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory()
    lh.add_table("lakehouse.logs", appends=6, services=("api",))
    before = lh.table("lakehouse.logs").metadata_location
    assert run_cli(["run", "--dry-run", "--config", str(lh.config_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    ops = {op["operation"]: op for op in report["tables"][0]["ops"]}
    assert "6 small files would be rewritten" in ops["optimize"]["details"]
    assert lh.table("lakehouse.logs").metadata_location == before
    assert not lh.catalog.table_exists(("lakehouse", "_maintenance_log"))


def test_demo_prints_before_and_after(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_cli(["demo"]) == 0
    out = capsys.readouterr().out
    lines = {
        line.split()[0]: line
        for line in out.splitlines()
        if line.startswith("lakehouse.") and "->" in line
    }
    assert "300 -> 5" in lines["lakehouse.logs"]
    assert "160 -> 4" in lines["lakehouse.spans"]
    assert "80 -> 1" in lines["lakehouse.orders"]
    assert (tmp_path / ".icegate" / "catalog.db").is_file()
    # The old orphan went, the file of a write in progress stayed.
    data = next((tmp_path / ".icegate" / "warehouse").glob("lakehouse*/logs/data"))
    assert not (data / "00000-failed-write-orphan.parquet").exists()
    assert (data / "00000-write-in-progress.parquet").exists()
    # A second demo rebuilds its own folder; a folder it did not build is refused.
    foreign = tmp_path / "mine"
    (foreign / "precious").mkdir(parents=True)
    assert run_cli(["demo", "--root", str(foreign)]) == 1
    assert "refuses to touch" in capsys.readouterr().err
    assert (foreign / "precious").is_dir()


def test_migrate_creates_the_icegate_tables_then_changes_nothing(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory()
    config = ["--config", str(lh.config_path)]

    assert run_cli(["migrate", *config, "--namespace", "otel"]) == 0
    first = capsys.readouterr().out
    assert run_cli(["migrate", *config, "--namespace", "otel", "--json"]) == 0
    second = json.loads(capsys.readouterr().out)

    for name in ("logs", "spans", "metrics", "events"):
        assert f"otel.{name}" in first and lh.catalog.table_exists(("otel", name))
    assert first.count("created") == 4
    assert [t["action"] for t in second["tables"]] == ["unchanged"] * 4
    assert run_cli(["migrate", *config, "--namespace", "a.b"]) == 2


def test_status_reports_a_table_with_a_lost_manifest_on_its_own_row(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory()
    lh.add_table("lakehouse.logs", appends=2)
    lh.add_table("lakehouse.broken", appends=2)
    snapshot = lh.table("lakehouse.broken").current_snapshot()
    assert snapshot is not None
    manifest = snapshot.manifests(lh.table("lakehouse.broken").io)[0].manifest_path
    Path(manifest.removeprefix("file://").removeprefix("file:")).unlink()

    code = run_cli(["status", "--config", str(lh.config_path), "--json"])
    rows = {row["table"]: row for row in json.loads(capsys.readouterr().out)}
    assert code == 1
    assert rows["lakehouse.logs"]["error"] is None
    assert rows["lakehouse.logs"]["health"]["score"] > 0
    assert rows["lakehouse.broken"]["stats"] is None
    assert (
        "FileNotFoundError" in rows["lakehouse.broken"]["error"]
        or "No such file" in (rows["lakehouse.broken"]["error"])
    )
