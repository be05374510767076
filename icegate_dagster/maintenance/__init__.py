"""The maintenance layer: plain Python with no Dagster imports, shared by the CLI and the assets.

Its rooms, by concern:

- :mod:`.maintainer`: the pass (tables, leases, operations, log rows), one implementation,
  beside what it is made of: :mod:`.tables` (a catalog's tables read from metadata, no
  JVM), :mod:`.outlook` (what a pass will ask of Spark, known before its JVM starts),
  :mod:`.spark_start` (the pass's Spark session, started ahead with the JIT it suits),
  :mod:`.live_rows` (rows a reader sees, counted by Spark), :mod:`.pass_memory` (the
  maintainer's side of the trigger's memory);
- :mod:`.ops`: the operations and their registry;
- :mod:`.health`: figures, score, due operations, the checks;
- :mod:`.trigger`: the trigger's memory of every table and its rules for what runs next;
- :mod:`.wal`: WAL ingest, exactly once;
- :mod:`.leases`: one maintainer per table, run heartbeats;
- :mod:`.log`: the maintenance log table and its upkeep;
- :mod:`.orphans`: the cheap look for orphan files, deferred deletion's candidates;
- single modules: :mod:`.results` (outcomes as dataclasses), :mod:`.identifiers` (table
  names), :mod:`.discovery` (which tables exist), :mod:`.exclusion` (which operations a
  table is excluded from: its opt-out, another optimizer's ownership), :mod:`.sharing`
  (tables whose locations overlap: the unsafe ones, the files they still reference),
  :mod:`.iceberg_java` (Iceberg's Java
  API on the driver), :mod:`.parallel` (tables side by side), :mod:`.pyiceberg_writes` (our own
  tables' creation and commit retries), :mod:`.migrate` (IceGate's schemas),
  :mod:`.sql_store` (the shared database's engine, clock and upserts).

May import ``config``, ``errors``, ``catalog`` and ``spark`` (the engine); never Dagster,
``render`` or an entry point (``tests/unit/test_import_layers.py`` keeps it so).
"""

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
