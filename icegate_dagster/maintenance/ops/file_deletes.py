"""Deleting a table's files through its Java FileIO, under the table's lease: what the
driver-side expiry and orphan removal on shared locations use (Iceberg's own cleanup cannot
consult the other tables sharing a folder, so these delete what was decided here)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from icegate_dagster.catalog import scrub
from icegate_dagster.errors import describe_error
from icegate_dagster.maintenance.leases.store import check_lease
from icegate_dagster.maintenance.ops.base import OpContext

#: Files deleted by one call of the FileIO's bulk delete, between two checks of the lease.
DELETE_BATCH = 500
#: Joins a batch of paths into one string for the JVM (a path holding it goes one by one).
_SEPARATOR = "\n"


@dataclass
class Deletion:
    """What :func:`delete_files` could not do: path -> why for each file left in place, and
    the lease error that stopped it, if one did."""

    failed: dict[str, str] = field(default_factory=dict)
    lease_lost: str | None = None


def _describe(ctx: OpContext, exc: BaseException) -> str:
    return describe_error(exc, lambda text: scrub(text, ctx.config))


def delete_files(ctx: OpContext, io: Any, paths: Sequence[str]) -> Deletion:
    """Delete ``paths``, in that order, through the table's Java FileIO ``io`` (the one
    Iceberg's own cleanup uses: Hadoop's checksum files go too, object stores get bulk
    deletes), :data:`DELETE_BATCH` at a time. The lease is checked before every batch: once
    it is lost, the rest stays (for orphan removal). A file already gone counts as deleted."""
    from py4j.java_gateway import is_instance_of

    spark = ctx.spark()
    jvm: Any = spark._jvm
    bulk = is_instance_of(
        spark.sparkContext._gateway, io, "org.apache.iceberg.io.SupportsBulkOperations"
    )
    deletion = Deletion()
    for start in range(0, len(paths), DELETE_BATCH):
        batch = list(paths[start : start + DELETE_BATCH])
        try:
            check_lease()
        except Exception as exc:
            deletion.lease_lost = _describe(ctx, exc)
            why = f"not deleted: {deletion.lease_lost}"
            deletion.failed.update((path, why) for path in paths[start:])
            break
        if bulk and not any(_SEPARATOR in path for path in batch):
            listed = jvm.java.util.regex.Pattern.compile(
                _SEPARATOR, jvm.java.util.regex.Pattern.LITERAL
            ).splitAsStream(_SEPARATOR.join(batch))
            try:
                io.deleteFiles(listed.collect(jvm.java.util.stream.Collectors.toList()))
            except Exception as exc:  # some failed (Iceberg counts them): which still exist
                why = _describe(ctx, exc)
                deletion.failed.update(
                    (path, why) for path in batch if io.newInputFile(path).exists()
                )
            continue
        for path in batch:
            try:
                io.deleteFile(path)
            except Exception as exc:
                deletion.failed[path] = _describe(ctx, exc)
    return deletion
