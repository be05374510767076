"""The health sensor's check evaluations: the verdicts of the checks a table's metadata
alone can judge (``healthy``, ``small_files``, ``snapshot_count``, ``wal_backlog``), on the
table's partition, each time one of them changes.

Recorded in a short run of ``icegate_health_checks`` (in the sensor's process, no Spark:
it only records; it keeps a heartbeat in the lease store like any maintenance run, so the
sensors fail one whose process died), not run-less: Dagster 1.13 stores each check
evaluation as a row of ``asset_check_executions`` under a unique index on (asset key,
check name, run id, partition), and every run-less event has the same run id (the empty
string), so the second run-less evaluation of a partition's check fails with an integrity
error (and with it the tick that reported it). A run gives each tick's evaluations a run
id of their own; only a tick with a changed verdict makes one.

Each evaluation judges the partition's latest materialization (as a maintenance run's
do), so the check's Partitions view shows the table Passed or Failed until a newer
materialization, whose run evaluates all six checks.
"""

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import dagster as dg

from icegate_dagster.assets.names import (
    CODE_LOCATION_TAGS,
    HEALTH_CHECKS_JOB,
    SOURCE_TAG,
    TABLES_TAG,
)
from icegate_dagster.assets.partition_events import log_checks
from icegate_dagster.assets.partition_observations import HEALTH_SOURCE
from icegate_dagster.config.secrets import scrub
from icegate_dagster.errors import describe_error
from icegate_dagster.maintenance.health.checks import CheckOutcome
from icegate_dagster.resources import LakehouseResource

#: Below this many seconds left before its deadline a tick starts no recording run (Dagster
#: takes about a second to start one); its verdicts wait for the next tick.
MIN_RUN_S = 3.0


@dataclass
class RecordedChecks:
    """What one recording run stored."""

    #: The tables whose evaluations were all stored.
    tables: list[str] = field(default_factory=list)
    run_id: str | None = None
    #: Why some were not (the run failed, or the tick ran out of time).
    problem: str | None = None


def record_checks(
    instance: dg.DagsterInstance,
    lakehouse: LakehouseResource,
    checks: Mapping[str, Sequence[CheckOutcome]],
    *,
    until: float,
) -> RecordedChecks:
    """Store each table's ``checks`` as evaluations of its partition, in one short run of
    :data:`HEALTH_CHECKS_JOB` (``lakehouse`` keeps its heartbeat), table by table until
    ``until`` (``time.monotonic()``): the tables left wait for the next tick."""
    recorded = RecordedChecks()
    if not checks:
        return recorded
    if until - time.monotonic() < MIN_RUN_S:
        recorded.problem = (
            f"no time left in this tick to record the check verdicts of {len(checks)} tables; "
            "they wait for the next"
        )
        return recorded

    @dg.op(
        name="record_checks",
        description="Record the check verdicts that changed.",
        required_resource_keys={"lakehouse"},  # its set-up keeps the run's heartbeat
    )
    def record(context: dg.OpExecutionContext) -> None:
        for table, outcomes in checks.items():
            if time.monotonic() >= until:
                return
            log_checks(context, table, outcomes)
            recorded.tables.append(table)

    @dg.job(
        name=HEALTH_CHECKS_JOB,
        executor_def=dg.in_process_executor,
        description="The health sensor's check verdicts that changed, one evaluation each.",
    )
    def health_checks() -> None:
        record()

    try:
        outcome = health_checks.execute_in_process(
            instance=instance,
            resources={"lakehouse": lakehouse},
            tags={SOURCE_TAG: HEALTH_SOURCE, TABLES_TAG: str(len(checks)), **CODE_LOCATION_TAGS},
            run_config={"loggers": {"console": {"config": {"log_level": "ERROR"}}}},
            raise_on_error=False,
        )
    except Exception as exc:  # the instance refused the run: the tick goes on without it
        error = describe_error(exc, lambda text: scrub(text, lakehouse.config()))
        recorded.problem = f"cannot record the check verdicts in a run: {error}"
        return recorded
    recorded.run_id = outcome.run_id
    if not outcome.success:
        recorded.problem = f"the Dagster run {outcome.run_id} recording the check verdicts failed"
    elif len(recorded.tables) < len(checks):
        recorded.problem = (
            f"recorded the check verdicts of {len(recorded.tables)} of {len(checks)} tables "
            "before the tick's deadline; the rest wait for the next"
        )
    return recorded
