"""An ``icegate-maintain`` pass in a Dagster instance's history.

With a Dagster instance configured (``DAGSTER_HOME``, or ``--dagster-home DIR``), each table
a CLI pass maintained is recorded as a maintenance run records it: a materialization of its
partition of ``maintained_table`` with the same metadata and one evaluation of each check,
in a short run of ``icegate_cli_pass`` (no Spark: it only records) tagged
``icegate/source=cli`` and ``icegate/cli_run_id`` (the CLI's run id, as in the log table).
Without one, nothing is recorded: the maintenance log stays the record every engine reads.
"""

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import dagster as dg

from icegate_dagster.assets.names import (
    CLI_PASS_JOB,
    CLI_RUN_TAG,
    CLI_SOURCE,
    ICEBERG_TABLES,
    MAINTAINED_TABLE,
    SOURCE_TAG,
    TABLES_TAG,
)
from icegate_dagster.assets.partition_events import TableRecord, log_checks, table_record
from icegate_dagster.config.secrets import scrub
from icegate_dagster.errors import ConfigError, IcegateError, describe_error
from icegate_dagster.maintenance import Maintainer, TableRef, TableResult
from icegate_dagster.maintenance.leases.holder import lease_store
from icegate_dagster.maintenance.leases.store import holder_description

DAGSTER_HOME = "DAGSTER_HOME"


def open_instance(dagster_home: str | None) -> dg.DagsterInstance | None:
    """The Dagster instance in ``dagster_home`` (else ``$DAGSTER_HOME``), or None when
    neither is set. A folder that is not there, or an instance that cannot be opened, is a
    configuration error naming it."""
    home = dagster_home or os.environ.get(DAGSTER_HOME)
    if not home:
        return None
    where = "--dagster-home" if dagster_home else f"${DAGSTER_HOME}"
    folder = Path(home).expanduser()
    if not folder.is_dir():
        raise ConfigError(
            f"{where} = {home!r}: not a folder (the Dagster instance this CLI records its "
            f"passes in; unset {DAGSTER_HOME} to record nothing)"
        )
    try:
        return dg.DagsterInstance.from_config(str(folder.resolve()))
    except Exception as exc:
        raise ConfigError(
            f"{where} = {home!r}: cannot open the Dagster instance: {describe_error(exc)}"
        ) from exc


def _recordable(
    instance: dg.DagsterInstance,
    discovered: Callable[[], set[str]],
    result: TableResult,
    partitions: set[str],
) -> TableRef | None:
    """The table's ref when its pass belongs in the history: a partition (a failed pass of
    a dropped table too, as a run records it), or a table discovery would make one (made a
    partition now). Others (names that are not tables, ``_`` tables, tables outside
    ``namespaces``) have no partition to be shown under."""
    try:
        ref = TableRef.parse(result.table)
    except IcegateError:
        return None
    if ref.is_internal:
        return None
    if result.table not in partitions:
        if result.before is None or ref.key not in discovered():
            return None
        instance.add_dynamic_partitions(ICEBERG_TABLES, [result.table])
        partitions.add(result.table)
    return ref


def record_pass(
    instance: dg.DagsterInstance, maintainer: Maintainer, results: Sequence[TableResult]
) -> list[str]:
    """Record each table of a CLI pass in ``instance`` (see the module docstring) through a
    short run of :data:`CLI_PASS_JOB` in this process; returns the tables recorded.

    A run, not run-less events: Dagster 1.13 stores one evaluation per check, run and
    partition, and every run-less event has the same empty run id, so a table's second pass
    could not record its checks run-less. The run keeps a heartbeat in the lease store like
    any maintenance run, so one whose process is killed is failed by the sensors."""
    partitions = set(instance.get_dynamic_partitions(ICEBERG_TABLES))
    discovered = functools.cache(lambda: {ref.key for ref in maintainer.discover()})
    prepared: list[tuple[str, TableRecord]] = []
    for result in results:
        ref = _recordable(instance, discovered, result, partitions)
        if ref is None:
            continue
        resolved = ref if result.before is not None else None
        prepared.append((result.table, table_record(maintainer, resolved, result)))
    if not prepared:
        return []
    recorded_by = f"icegate-maintain, run {maintainer.run_id}"

    @dg.op(name="record_tables", description="Record each table the CLI pass maintained.")
    def record_tables(context: dg.OpExecutionContext) -> None:
        store = lease_store(maintainer.config, maintainer.catalog)
        done = threading.Event()
        if store is not None:
            run_id = context.run.run_id
            store.start_heartbeat(run_id, holder_description(run_id), lambda: not done.is_set())
        try:
            for key, record in prepared:
                context.log_event(
                    dg.AssetMaterialization(
                        asset_key=MAINTAINED_TABLE,
                        partition=key,
                        description=f"maintained by {recorded_by}",
                        metadata={"recorded_by": recorded_by, **record.metadata},
                        tags={SOURCE_TAG: CLI_SOURCE, CLI_RUN_TAG: maintainer.run_id},
                    )
                )
                log_checks(context, key, record.outcomes)
        finally:
            done.set()

    @dg.job(
        name=CLI_PASS_JOB,
        executor_def=dg.in_process_executor,
        description="A pass of icegate-maintain, recorded: each table it maintained.",
    )
    def cli_pass() -> None:
        record_tables()

    outcome = cli_pass.execute_in_process(
        instance=instance,
        tags={
            SOURCE_TAG: CLI_SOURCE,
            CLI_RUN_TAG: maintainer.run_id,
            TABLES_TAG: str(len(prepared)),
        },
        run_config={"loggers": {"console": {"config": {"log_level": "ERROR"}}}},
        raise_on_error=False,
    )
    if not outcome.success:
        raise IcegateError(f"the Dagster run {outcome.run_id} recording the pass failed")
    memory = maintainer.memory
    if memory is not None:  # the health sensor compares with what the pages now show
        with contextlib.suppress(Exception):
            memory.show([(key, record.shown(), True) for key, record in prepared], memory.now())
    return [key for key, _ in prepared]


def record_or_warn(
    instance: dg.DagsterInstance, maintainer: Maintainer, results: Sequence[TableResult]
) -> tuple[bool, str]:
    """:func:`record_pass`, and a line saying what was recorded, or why nothing could be
    (False: the pass itself stands, its log rows are written)."""
    try:
        recorded = record_pass(instance, maintainer, results)
    except Exception as exc:
        error = describe_error(exc, lambda text: scrub(text, maintainer.config))
        return False, f"could not record the pass in the Dagster instance: {error}"
    return True, (
        f"recorded {len(recorded)} tables as materializations of maintained_table in the "
        f"Dagster instance at {instance.root_directory}"
    )
