"""A table's WAL: Parquet files an ingester lands under ``<wal.root>/<namespace>/<table>/``,
appended to the Iceberg table exactly once by :func:`compact_wal`.

The modules, by concern:

- :mod:`.files`: listing, sizing and quarantine of WAL folders (file system only, no JVM);
- :mod:`.root_listing`: one listing of ``wal.root`` at a time, waited for up to a deadline;
- :mod:`.schema`: whether a file's Parquet footer fits the table's schema (pyarrow, no JVM);
- :mod:`.frame`: the Spark DataFrame of a batch, timestamps converted exactly (SQL and
  DataFrames only: it works over Spark Connect);
- :mod:`.publish`: the exactly-once protocol (staging branch, one pyiceberg commit that
  requires main unmoved, ledger; no JVM but for format-version 3 tables);
- :mod:`.folder_lock`: one compaction per table at a time on a host;
- :mod:`.checkpoints`: the step boundaries where crash tests strike;
- :mod:`.compaction`: one run, from the lock to the deletes.

May import: ``config``, ``errors``, ``spark``, :mod:`..identifiers`,
:mod:`..results`, :mod:`..iceberg_java`, :mod:`..leases`. Never :mod:`..ops`, Dagster or
presentation.
"""

from icegate_dagster.maintenance.wal.checkpoints import CHECKPOINTS, KILL_AT_ENV, FaultHook
from icegate_dagster.maintenance.wal.compaction import compact_wal
from icegate_dagster.maintenance.wal.files import (
    QUARANTINE_DIR,
    REASON_SUFFIX,
    FolderCount,
    RootFolders,
    WalFile,
    WalRoot,
    WalStats,
    backlogs_of,
    compaction_due,
    configured_wal_root,
    is_wal_name,
    list_root_folders,
    list_wal_files,
    quarantine,
    quarantined_files,
    resolve_wal_root,
    wal_backlogs,
    wal_filesystem,
    wal_folder_problem,
    wal_location,
    wal_stats,
)
from icegate_dagster.maintenance.wal.folder_lock import LOCK_FILE, wal_folder_lock
from icegate_dagster.maintenance.wal.frame import spark_path
from icegate_dagster.maintenance.wal.publish import (
    BATCH_PROPERTY,
    FILES_PROPERTY,
    LEDGER_PROPERTY,
    PUBLISH_ATTEMPTS,
    STAGING_PREFIX,
    STALE_STAGING,
    AlreadyCommitted,
    committed_wal_files,
    drop_stale_staging,
    settle_committed,
    wal_files_to_settle,
)
from icegate_dagster.maintenance.wal.root_listing import ListingUnderWay, RootListing, RootListings
from icegate_dagster.maintenance.wal.schema import schema_problem

__all__ = [
    "BATCH_PROPERTY",
    "CHECKPOINTS",
    "FILES_PROPERTY",
    "KILL_AT_ENV",
    "LEDGER_PROPERTY",
    "LOCK_FILE",
    "PUBLISH_ATTEMPTS",
    "QUARANTINE_DIR",
    "REASON_SUFFIX",
    "STAGING_PREFIX",
    "STALE_STAGING",
    "AlreadyCommitted",
    "FaultHook",
    "FolderCount",
    "ListingUnderWay",
    "RootFolders",
    "RootListing",
    "RootListings",
    "WalFile",
    "WalRoot",
    "WalStats",
    "backlogs_of",
    "committed_wal_files",
    "compact_wal",
    "compaction_due",
    "configured_wal_root",
    "drop_stale_staging",
    "is_wal_name",
    "list_root_folders",
    "list_wal_files",
    "quarantine",
    "quarantined_files",
    "resolve_wal_root",
    "schema_problem",
    "settle_committed",
    "wal_files_to_settle",
    "spark_path",
    "wal_filesystem",
    "wal_folder_lock",
    "wal_folder_problem",
    "wal_location",
    "wal_backlogs",
    "wal_stats",
]
