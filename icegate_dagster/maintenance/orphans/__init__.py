"""Orphan files: files in a table's folder that no snapshot references.

- :mod:`.listing`: a cheap look (one listing against the metadata) before asking Iceberg;
- :mod:`.candidates`: the candidates table of deferred deletion (collect now, delete
  later) and the rules that decide a collected candidate's fate.

The operations themselves are in :mod:`..ops` (``remove_orphan_files``, and the
deferred ``collect`` / ``delete collected`` in :mod:`..ops.deferred_orphans`).

May import: ``errors``, :mod:`..discovery`, :mod:`..identifiers`,
:mod:`..pyiceberg_writes`. Never :mod:`..ops`, Dagster or presentation.
"""
