"""The code location loads, with the contract's names, schedule and concurrency settings."""

from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import yaml

from icegate_dagster.assets.maintained_table import POOL
from icegate_dagster.assets.names import MAINTENANCE_TAG, iceberg_tables
from icegate_dagster.definitions import defs
from icegate_dagster.jobs.maintenance import daily_maintenance
from icegate_dagster.maintenance import OPERATIONS
from icegate_dagster.resources import LakehouseResource
from tests.lakehouse import make_lakehouse

REPO = Path(__file__).resolve().parents[2]


def test_definitions_load_with_contract_names() -> None:
    assert dg.Definitions.validate_loadable(defs) is None
    graph = defs.resolve_asset_graph()
    keys = {key.to_user_string() for key in graph.get_all_asset_keys()}
    assert keys == {"maintained_table", "maintenance_log", "lakehouse_health"}
    assert graph.get(dg.AssetKey("maintained_table")).partitions_def == iceberg_tables
    assert iceberg_tables.name == "iceberg_tables"
    assert defs.resolve_job_def("maintenance_job") is not None
    assert defs.resolve_sensor_def("iceberg_table_discovery") is not None
    assert defs.resolve_sensor_def("wal_size_sensor") is not None
    health_sensor = defs.resolve_sensor_def("table_health_sensor")
    # The sensors request batches: several tables per run, each doing its own operations.
    assert health_sensor.job_name == "maintenance_batch_job"
    assert defs.resolve_sensor_def("wal_size_sensor").job_name == "maintenance_batch_job"
    # Every job that starts Spark tags its runs for the instance's limit on them.
    for name in (
        "maintenance_job",
        "maintenance_batch_job",
        "rollback_job",
        "collect_orphans_job",
        "delete_collected_orphans_job",
    ):
        assert defs.resolve_job_def(name).tags.get(MAINTENANCE_TAG) == "spark", name
    assert health_sensor.minimum_interval_seconds == 30
    assert health_sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert defs.resolve_job_def("migrate_job") is not None
    check_names = {key.name for key in graph.asset_check_keys}
    assert check_names == {
        "rows_preserved",
        "small_files",
        "snapshot_count",
        "wal_backlog",
        "ops_succeeded",
        "healthy",
    }
    # Lineage: the log is downstream of the maintained tables.
    parents = graph.get(dg.AssetKey("maintenance_log")).parent_keys
    assert parents == {dg.AssetKey("maintained_table")}
    health = graph.get(dg.AssetKey("lakehouse_health"))
    assert health.parent_keys == {dg.AssetKey("maintained_table")}
    assert health.group_name == "iceberg_maintenance" and health.partitions_def is None


def test_maintenance_steps_are_visible_and_pooled() -> None:
    job = defs.resolve_job_def("maintenance_job")
    graph_node = job.graph.node_named("maintained_table")
    steps = {node.name for node in graph_node.definition.nodes}  # type: ignore[attr-defined]
    # One step per registered operation, between the two steps every run has.
    assert steps == {"plan", *OPERATIONS.names(), "record"}
    pools = {node.name: node.definition.pool for node in graph_node.definition.nodes}  # type: ignore[attr-defined]
    assert pools["optimize"] == POOL and pools["remove_orphan_files"] == POOL
    # The sensors' batch job runs the very same steps.
    batch = defs.resolve_job_def("maintenance_batch_job")
    batch_steps = {node.name: node.definition for node in batch.graph.nodes}
    assert set(batch_steps) == {
        "plan_batch",
        *OPERATIONS.names(),
        "record_batch",
        "update_maintenance_log",
    }
    for name in OPERATIONS.names():
        assert batch_steps[name] is graph_node.definition.node_named(name).definition  # type: ignore[attr-defined]


def test_daily_schedule_cron_timezone_and_job(tmp_path: Path) -> None:
    """At 03:00 UTC, runs of the sensors' batch job (what it asks for: ``test_daily_schedule``);
    a catalog with no table gets no run, and the skip reason says so."""
    schedule = defs.resolve_schedule_def("daily_maintenance")
    assert schedule.cron_schedule == "0 3 * * *"
    assert schedule.execution_timezone == "UTC"
    assert schedule.job_name == "maintenance_batch_job"
    lakehouse = make_lakehouse(tmp_path / "empty")
    resources = {"lakehouse": LakehouseResource(config_path=str(lakehouse.config_path))}
    with dg.instance_for_test() as instance, dg.build_schedule_context(
        instance=instance,
        resources=resources,
        scheduled_execution_time=datetime(2026, 11, 21, 3, tzinfo=UTC),
    ) as context:
        skipped = daily_maintenance(context)
    assert isinstance(skipped, dg.SkipReason)
    assert "has no table to maintain" in str(skipped.skip_message)


def test_shipped_dagster_yaml_limits_runs_not_steps() -> None:
    for path in (REPO / "dagster.yaml", REPO / "deploy" / "dagster.yaml"):
        settings = yaml.safe_load(path.read_text())
        concurrency = settings["concurrency"]
        per_table, maintenance = concurrency["runs"]["tag_concurrency_limits"]
        assert per_table == {
            "key": "dagster/partition",
            "value": {"applyLimitPerUniqueValue": True},
            "limit": 1,
        }, path
        # Pool limits count runs: no started run waits step by step with a JVM up. The tag
        # limit on maintenance runs holds the same number.
        assert concurrency["pools"]["granularity"] == "run", path
        assert maintenance == {
            "key": MAINTENANCE_TAG,
            "limit": concurrency["pools"]["default_limit"],
        }, path
        assert concurrency["runs"]["max_concurrent_runs"] >= concurrency["pools"]["default_limit"]
        assert settings["run_monitoring"]["enabled"] is True, path
        overrides = {key: settings[key] for key in ("concurrency", "run_queue", "run_monitoring")}
        with dg.instance_for_test(overrides=overrides) as instance:
            # The instance accepts the settings as shipped.
            config = instance.get_concurrency_config()
            assert config.pool_config.default_pool_limit == concurrency["pools"]["default_limit"]
            assert config.pool_config.pool_granularity is not None
            assert config.pool_config.pool_granularity.value == "run"
            assert instance.run_monitoring_enabled


def test_shipped_dagster_yaml_bounds_the_tick_history() -> None:
    """Dagster keeps successful schedule and sensor ticks forever unless told: the shipped
    instances purge every kind of tick (runs: maintain.history.runs, test_run_history)."""
    from dagster._core.definitions.run_request import InstigatorType
    from dagster._core.scheduler.instigation import TickStatus

    for path in (REPO / "dagster.yaml", REPO / "deploy" / "dagster.yaml"):
        retention = yaml.safe_load(path.read_text())["retention"]
        with dg.instance_for_test(overrides={"retention": retention}) as instance:
            for kind in (InstigatorType.SCHEDULE, InstigatorType.SENSOR):
                days = instance.get_tick_retention_settings(kind)
                assert set(days) >= {TickStatus.SUCCESS, TickStatus.SKIPPED}, (path, kind)
                assert all(0 < kept <= 30 for kept in days.values()), (path, kind, days)
