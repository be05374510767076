"""The maintenance layer: plain Python with no Dagster imports, shared by the CLI and the assets."""

from icegate_dagster.maintenance.identifiers import TableRef
from icegate_dagster.maintenance.maintainer import Maintainer, new_run_id
from icegate_dagster.maintenance.ops import OPERATIONS
from icegate_dagster.maintenance.results import OpResult, TableResult, TableStats

__all__ = [
    "OPERATIONS",
    "Maintainer",
    "OpResult",
    "TableRef",
    "TableResult",
    "TableStats",
    "new_run_id",
]
