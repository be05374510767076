"""One maintainer per table across the deployment, and a heartbeat per Dagster run.

- :mod:`.store`: the lease rows and run heartbeats in a shared SQL database;
- :mod:`.holder`: the maintainer's side: hold a table for one operation, or say who does;
- :mod:`.process`: which process a heartbeat comes from, and whether it still runs.

May import: ``config``, ``errors``, :mod:`..results`, :mod:`..sql_store`. Never Dagster or
presentation.
"""
