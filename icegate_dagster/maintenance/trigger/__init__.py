"""The trigger's memory and rules: what maintenance did to each table, operation by
operation, and what the trigger saw of it, kept in the deployment's shared SQL database
(the lease store's) where every maintainer writes as each table finishes; and the rules
that pick which due tables to maintain now.

- :mod:`.records`: an attempt's outcome (failed, held elsewhere, still due after it),
  consecutive failures, when the operation may be tried next (pure);
- :mod:`.store`: the four tables (outcomes per operation; the trigger's decisions, the
  last pass and what each partition shows; the last look at each table; each sensor's last
  request and its run key) and their queries;
- :mod:`.selection`: which due tables go now, which wait and why, the lakehouse's totals
  (pure);
- :mod:`.look`: what changed since the last look: the catalog's tables and each one's
  health, re-read only where it may have changed (the sensors and the exporter read it);
- :mod:`.decision`: the decision over one look, taking the clock and the settings, and the
  one lakehouse report the sensor and the ``lakehouse_health`` asset both record;
- :mod:`.daily`: the daily schedule's pass from one look and decision: the tables that get
  a run, and the log rows of the others (pure).

May import: ``config``, ``errors``, ``catalog`` (secret masking), :mod:`..sql_store`,
:mod:`..health` (the health summary it stores and selects on), and for the look and the
decision :mod:`..identifiers`, :mod:`..discovery`, :mod:`..sharing`, :mod:`..wal` and
:mod:`..ops` (the registry, the ``gc.enabled`` gate); for the daily pass :mod:`..results`
(the log rows it writes for the tables looked at). Never Dagster or presentation, nor
:mod:`..leases`, :mod:`..maintainer` (the look reads through a protocol a ``Maintainer``
meets).
"""
