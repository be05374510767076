"""A table's health, from its metadata alone (pyiceberg, no JVM, no data read).

- :mod:`.manifest_walk`: the one walk over the current snapshot's manifests that every
  figure below is built from, cached per metadata file;
- :mod:`.stats`: :class:`~icegate_dagster.maintenance.results.TableStats` (files, bytes,
  rows, small files, snapshots, manifests) for before/after figures;
- :mod:`.score`: the health score from 0 to 100 and the due operations, with why;
- :mod:`.summary`: a table's health in the few figures the trigger keeps between looks;
- :mod:`.checks`: a table's asset checks after a pass;
- :mod:`.after_pass`: its health right after a pass, the ``healthy`` verdict, read now.

May import: ``config``, ``errors``, ``catalog`` (secret masking), :mod:`..identifiers`,
:mod:`..results`, :mod:`..ops` (the gates and plans the score reuses) and :mod:`..wal`
(backlog figures). Never Dagster or presentation.
"""
