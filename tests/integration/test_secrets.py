"""Secrets given through the environment never reach output, logs, metadata or the log table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

from icegate_dagster.assets.names import iceberg_tables
from icegate_dagster.cli.dispatch import run_cli
from icegate_dagster.definitions import defs
from icegate_dagster.resources import LakehouseResource, SparkResource
from tests.lakehouse import LakehouseFactory
from tests.servers import free_port

SECRETS = {
    "ICEGATE_TEST_S3_SECRET": "s3-SECRET-value-0f9a7c",
    "ICEGATE_TEST_TOKEN": "token-SECRET-value-8d2b1e",
    "ICEGATE_TEST_PASSWORD": "pw-SECRET-value-5e6f7a",
}


def test_secrets_stay_out_of_every_output(
    lakehouse_factory: LakehouseFactory,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    lh = lakehouse_factory()
    lh.add_table("lakehouse.logs", appends=4)
    lh.add_table("lakehouse.orders", appends=6)
    raw = yaml.safe_load(lh.config_path.read_text())
    raw["catalog"].update(
        {
            "s3.access-key-id": "AKIAEXAMPLE",
            "s3.secret-access-key": "${ICEGATE_TEST_S3_SECRET}",
            "token": "${ICEGATE_TEST_TOKEN}",
            "password": "${ICEGATE_TEST_PASSWORD}",
        }
    )
    lh.config_path.write_text(yaml.safe_dump(raw))
    lost = lh.data_file_paths("lakehouse.orders")[0]
    lost.unlink()  # a failing op: its error message is built from Java's and the config's
    config = ["--config", str(lh.config_path)]

    outputs = []
    for args in (["run", *config], ["run", *config, "--json"], ["status", *config]):
        run_cli(args)
        captured = capfd.readouterr()  # file-descriptor level: the JVM's output too
        outputs += [captured.out, captured.err]
    assert "FAILED" in outputs[0]  # the failing op did report

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(iceberg_tables.name, ["lakehouse.logs"])
        result = defs.resolve_job_def("maintenance_job").execute_in_process(
            instance=instance,
            partition_key="lakehouse.logs",
            resources={
                "lakehouse": LakehouseResource(config_path=str(lh.config_path)),
                "spark": SparkResource(),
            },
        )
        assert result.success
        events = [str(e) for e in instance.all_logs(result.run_id)]
        materializations = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("maintained_table")), limit=10
        ).records
        metadata = [
            str(r.asset_materialization.metadata)
            for r in materializations
            if r.asset_materialization
        ]
    captured = capfd.readouterr()
    outputs += [captured.out, captured.err]
    log_table = json.dumps(lh.log_rows(), default=str)

    haystacks = {"cli and process output": "\n".join(outputs), "dagster events": "\n".join(events)}
    haystacks |= {"metadata": "\n".join(metadata), "log table": log_table}
    assert len(log_table) > 500 and len(haystacks["dagster events"]) > 500
    for where, text in haystacks.items():
        for secret in SECRETS.values():
            assert secret not in text, f"a secret leaked into the {where}"


def test_a_catalog_that_cannot_be_opened_names_no_password(tmp_path: Path) -> None:
    """A PostgreSQL catalog given its password as ``?password=``, on a port nobody listens
    on: the real CLI says which catalog cannot be opened, its password masked, in text and
    in ``--json`` (the same message reaches /health, logs and Dagster)."""
    secret = "qpw-SECRET-c41d9e"
    config_path = tmp_path / "icegate.yaml"
    uri = f"postgresql+psycopg2://ice@127.0.0.1:{free_port()}/cat?password={secret}"
    config_path.write_text(yaml.safe_dump({"catalog": {"uri": uri, "warehouse": "wh"}}))
    maintain = Path(sys.executable).parent / "icegate-maintain"
    env = {k: v for k, v in os.environ.items() if k != "ICEGATE_CONFIG"}

    for args in (["status"], ["status", "--json"], ["run", "--json"]):
        done = subprocess.run(  # noqa: S603
            [str(maintain), *args, "--config", str(config_path)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        output = done.stdout + done.stderr
        assert done.returncode != 0, output
        assert "cannot be opened" in output and "127.0.0.1" in output, output
        assert "password=***" in output, output
        assert secret not in output, f"the password leaked from {args}"
