"""Names DESIGN.md's contract promises users, shared by the tests that check them."""

#: The metadata keys on every partition's materialization of ``maintained_table``.
CONTRACT_METADATA_KEYS = (
    "files_before",
    "files_after",
    "bytes_before",
    "bytes_after",
    "snapshots_before",
    "snapshots_after",
    "rows_before",
    "rows_after",
    "wal_files_ingested",
    "orphans_removed",
    "duration_s",
)
