"""The maintenance operations, one module each, and their registry.

To add one: write its module (an :class:`Operation` subclass), add one line to
``OPERATIONS`` below where it belongs in the pass, add its settings block to
``TableSettings`` in ``config.py``, and document it. The CLI, the Dagster steps, the
dry-run plans, the log and the partition metadata all read ``OPERATIONS``.
"""

from icegate_dagster.maintenance.ops.base import (
    FaultHook,
    OpContext,
    Operation,
    SparkProvider,
    perform,
)
from icegate_dagster.maintenance.ops.expire_snapshots import ExpireSnapshots
from icegate_dagster.maintenance.ops.optimize import Optimize
from icegate_dagster.maintenance.ops.registry import Registry
from icegate_dagster.maintenance.ops.remove_orphan_files import RemoveOrphanFiles
from icegate_dagster.maintenance.ops.retention import Retention
from icegate_dagster.maintenance.ops.rewrite_manifests import RewriteManifests
from icegate_dagster.maintenance.ops.rollback import RollbackToSnapshot
from icegate_dagster.maintenance.ops.wal_compaction import WalCompaction

#: The operations, in the order a full pass runs them.
OPERATIONS = Registry(
    [
        WalCompaction(),
        Optimize(),
        RewriteManifests(),
        ExpireSnapshots(),
        RemoveOrphanFiles(),
        Retention(),
    ]
)

__all__ = [
    "OPERATIONS",
    "FaultHook",
    "OpContext",
    "Operation",
    "Registry",
    "RollbackToSnapshot",
    "SparkProvider",
    "perform",
]
