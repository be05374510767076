"""The maintenance operations, one module each, and their registry.

- :mod:`.base`: what an operation is (:class:`Operation`, :class:`OpContext`) and the
  gates every one shares; :mod:`.registry`: the ordered list of them;
- :mod:`.procedures`: calling Iceberg's Spark procedures, with commit retries;
  :mod:`.file_deletes`: deleting files the project decided on (the driver-side expiry,
  orphans of a shared folder) through the table's FileIO, under its lease;
- one module per operation of the full pass, in pass order: :mod:`.wal_compaction`,
  :mod:`.optimize`, :mod:`.rewrite_position_delete_files`, :mod:`.rewrite_manifests`,
  :mod:`.compute_table_stats`, :mod:`.expire_snapshots`, :mod:`.remove_orphan_files`,
  :mod:`.retention`;
- operations outside the pass: :mod:`.rollback` (``rollback``) and
  :mod:`.deferred_orphans` (``orphans --collect`` / ``--delete-collected``).

To add one: write its module (an :class:`Operation` subclass), add one line to
``OPERATIONS`` below where it belongs in the pass, add its settings block to
``TableSettings`` in ``config/models.py``, and document it. The CLI's commands and
before/after table, the Dagster steps and their descriptions, the full pass and its
dry-run plans, and the partition metadata all read ``OPERATIONS``; log rows carry
whatever operations ran.

May import: ``config``, ``errors``, ``catalog``, :mod:`..results`, :mod:`..identifiers`,
:mod:`..discovery`, :mod:`..exclusion`, :mod:`..sharing`, :mod:`..leases`,
:mod:`..orphans`, :mod:`..wal`. Never
:mod:`..health` (which reads the operations' plans), Dagster or presentation.
"""

from icegate_dagster.maintenance.ops.base import (
    FaultHook,
    OpContext,
    Operation,
    Plan,
    SparkProvider,
    perform,
    skip_reason,
)
from icegate_dagster.maintenance.ops.compute_table_stats import ComputeTableStats
from icegate_dagster.maintenance.ops.expire_snapshots import ExpireSnapshots
from icegate_dagster.maintenance.ops.optimize import Optimize
from icegate_dagster.maintenance.ops.registry import Registry
from icegate_dagster.maintenance.ops.remove_orphan_files import RemoveOrphanFiles
from icegate_dagster.maintenance.ops.retention import Retention
from icegate_dagster.maintenance.ops.rewrite_manifests import RewriteManifests
from icegate_dagster.maintenance.ops.rewrite_position_delete_files import (
    RewritePositionDeleteFiles,
)
from icegate_dagster.maintenance.ops.rollback import RollbackToSnapshot
from icegate_dagster.maintenance.ops.wal_compaction import WalCompaction

#: The operations, in the order a full pass runs them.
OPERATIONS = Registry(
    [
        WalCompaction(),
        Optimize(),
        RewritePositionDeleteFiles(),
        RewriteManifests(),
        ComputeTableStats(),
        ExpireSnapshots(),
        RemoveOrphanFiles(),
        Retention(),
    ]
)

__all__ = [
    "OPERATIONS",
    "FaultHook",
    "OpContext",
    "Plan",
    "Operation",
    "Registry",
    "RollbackToSnapshot",
    "SparkProvider",
    "perform",
    "skip_reason",
]
