"""The maintenance operations, one module each, and their registry.

To add one: write its module (an :class:`Operation` subclass), add one line to
``OPERATIONS`` below where it belongs in the pass, add its settings block to
``TableSettings`` in ``config/models.py``, and document it. The CLI's commands and
before/after table, the Dagster steps and their descriptions, the full pass and its
dry-run plans, and the partition metadata all read ``OPERATIONS``; log rows carry
whatever operations ran.
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
