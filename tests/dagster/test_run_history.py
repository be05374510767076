"""The instance's run history is kept for ``maintain.history.runs``: the discovery sensor
deletes this code location's finished runs that ended longer ago, with their events, and
nothing else: not a recent run, not an unfinished one however old, not another code
location's run (even of a job with the same name), not a run holding a table's latest
materialization. Old runs are made by finishing real runs of a real instance under
Dagster's own ``freeze_time`` (as the orphan tests back-date files with ``os.utime``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import dagster as dg
from dagster._core.events import StepMaterializationData
from dagster._core.remote_origin import (
    RegisteredCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.test_utils import freeze_time

from icegate_dagster.assets.names import BATCH_JOB, CLI_PASS_JOB, CLI_SOURCE, SOURCE_TAG
from icegate_dagster.assets.runs import BatchEntry, batch_run_config
from icegate_dagster.definitions import defs
from icegate_dagster.resources import LakehouseResource
from icegate_dagster.sensors.discovery_sensor import RUNS_CURSOR, iceberg_table_discovery
from icegate_dagster.sensors.run_history import forget_old_runs
from tests.lakehouse import Lakehouse

OURS = "icegate_dagster.definitions"
THEIRS = "another_team"
MATERIALIZED = dg.AssetKey("maintained_table")


def _origin(location: str, job: str) -> RemoteJobOrigin:
    repository = RemoteRepositoryOrigin(RegisteredCodeLocationOrigin(location), "__repository__")
    return RemoteJobOrigin(repository, job)


def _run(
    instance: dg.DagsterInstance,
    job: str,
    *,
    location: str | None = OURS,
    ended_days_ago: float | None,
    status: dg.DagsterRunStatus = dg.DagsterRunStatus.FAILURE,
) -> str:
    """A run of ``job`` launched from ``location`` (None: in process) that started 60 days
    ago and finished ``ended_days_ago`` (None: still running) with ``status``."""
    run = instance.create_run_for_job(
        defs.resolve_job_def(job),
        remote_job_origin=_origin(location, job) if location else None,
        run_config=(
            batch_run_config([BatchEntry("lakehouse.logs", ("optimize",), "s")])
            if job == BATCH_JOB
            else None
        ),
    )
    now = datetime.now(UTC)

    def report(kind: dg.DagsterEventType) -> None:
        event = dg.DagsterEvent(kind.value, job_name=job, message=kind.value)
        instance.report_dagster_event(event, run_id=run.run_id)

    with freeze_time(now - timedelta(days=60)):
        report(dg.DagsterEventType.RUN_START)
    if ended_days_ago is not None:
        with freeze_time(now - timedelta(days=ended_days_ago)):
            report(
                {
                    dg.DagsterRunStatus.CANCELED: dg.DagsterEventType.RUN_CANCELED,
                    dg.DagsterRunStatus.FAILURE: dg.DagsterEventType.RUN_FAILURE,
                    dg.DagsterRunStatus.SUCCESS: dg.DagsterEventType.RUN_SUCCESS,
                }[status]
            )
    record = instance.get_run_record_by_id(run.run_id)
    assert record is not None and record.dagster_run.status == (
        status if ended_days_ago is not None else dg.DagsterRunStatus.STARTED
    )
    return run.run_id


def _materialize(instance: dg.DagsterInstance, run_id: str, table: str) -> None:
    instance.report_dagster_event(
        dg.DagsterEvent(
            dg.DagsterEventType.ASSET_MATERIALIZATION.value,
            job_name="maintenance_job",
            event_specific_data=StepMaterializationData(
                dg.AssetMaterialization(asset_key=MATERIALIZED, partition=table)
            ),
        ),
        run_id=run_id,
    )


def _alive(instance: dg.DagsterInstance, *run_ids: str) -> set[str]:
    return {run_id for run_id in run_ids if instance.get_run_by_id(run_id) is not None}


def test_old_finished_runs_of_this_code_location_are_deleted_and_nothing_else(
    instance: dg.DagsterInstance, small_lakehouse: Lakehouse
) -> None:
    old_failed = _run(instance, "maintenance_batch_job", ended_days_ago=40)
    old_canceled = _run(
        instance, "maintenance_job", ended_days_ago=35, status=dg.DagsterRunStatus.CANCELED
    )
    old_success = _run(
        instance, "migrate_job", ended_days_ago=31, status=dg.DagsterRunStatus.SUCCESS
    )
    old_cli_pass = _run(
        instance,
        "maintenance_job",
        location=None,
        ended_days_ago=60,
        status=dg.DagsterRunStatus.SUCCESS,
    )
    recent = _run(instance, "maintenance_batch_job", ended_days_ago=29)
    old_started = _run(instance, "maintenance_batch_job", ended_days_ago=None)  # 60 days on
    theirs = _run(instance, "migrate_job", location=THEIRS, ended_days_ago=90)
    theirs_in_process = _run(instance, "migrate_job", location=None, ended_days_ago=90)
    holds_latest = _run(instance, "maintenance_job", ended_days_ago=50)
    _materialize(instance, holds_latest, "lakehouse.quiet")
    superseded = _run(instance, "maintenance_job", ended_days_ago=45)
    _materialize(instance, superseded, "lakehouse.busy")
    _materialize(instance, recent, "lakehouse.busy")
    everything = (
        old_failed,
        old_canceled,
        old_success,
        old_cli_pass,
        recent,
        old_started,
        theirs,
        theirs_in_process,
        holds_latest,
        superseded,
    )
    assert _alive(instance, *everything) == set(everything)

    context = dg.SensorEvaluationContext(
        instance_ref=None,
        instance=instance,
        resources={"lakehouse": LakehouseResource(config_path=str(small_lakehouse.config_path))},
        code_location_origin=RegisteredCodeLocationOrigin(OURS),
    )
    iceberg_table_discovery(context)

    assert _alive(instance, *everything) == {
        recent,
        old_started,
        theirs,
        theirs_in_process,
        holds_latest,
        old_cli_pass,  # in process, but no CLI pass: a maintenance_job someone ran by hand
    }
    # Its events went with it; the kept runs keep theirs.
    assert instance.all_logs(old_failed) == []
    assert instance.all_logs(recent)
    assert json.loads(context.cursor or "{}") == {RUNS_CURSOR: None}


def test_cli_passes_are_deleted_without_a_known_location_and_work_is_bounded_per_call(
    instance: dg.DagsterInstance,
) -> None:
    @dg.op
    def record_tables() -> None:
        pass

    @dg.job(name=CLI_PASS_JOB)
    def cli_pass() -> None:
        record_tables()

    with freeze_time(datetime.now(UTC) - timedelta(days=40)):
        recorded = cli_pass.execute_in_process(instance=instance, tags={SOURCE_TAG: CLI_SOURCE})
        by_hand = cli_pass.execute_in_process(instance=instance)  # no icegate/source tag
    launched = [_run(instance, "maintenance_batch_job", ended_days_ago=40) for _ in range(3)]
    now = datetime.now(UTC)

    unknown = forget_old_runs(instance, None, timedelta(days=30), now)

    # Without its own location, only the CLI's recorded passes are this code location's.
    assert unknown.deleted == (recorded.run_id,)
    assert _alive(instance, by_hand.run_id, *launched) == {by_hand.run_id, *launched}

    first = forget_old_runs(instance, OURS, timedelta(days=30), now, runs_per_call=2)
    assert first.deleted == tuple(launched[:2])
    second = forget_old_runs(instance, OURS, timedelta(days=30), now, cursor=first.cursor)
    assert second.deleted == (launched[2],) and second.cursor is None
    assert _alive(instance, by_hand.run_id, *launched) == {by_hand.run_id}
