"""Deleting a table's files under the table's lease: what the driver-side expiry and orphan
removal on shared locations use (Iceberg's own cleanup cannot consult the other tables
sharing a folder, so these delete what was decided here), through the table's Java FileIO;
and orphan removal decided from metadata alone, through its pyiceberg FileIO, no JVM."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from icegate_dagster.config.secrets import scrub
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


def _batches(
    ctx: OpContext, paths: Sequence[str], delete_batch: Callable[[list[str], Deletion], None]
) -> Deletion:
    """``delete_batch`` over ``paths``, :data:`DELETE_BATCH` at a time, the lease checked
    before every batch: once it is lost, the rest stays (what orphan removal needs)."""
    deletion = Deletion()
    for start in range(0, len(paths), DELETE_BATCH):
        try:
            check_lease()
        except Exception as exc:
            deletion.lease_lost = _describe(ctx, exc)
            why = f"not deleted: {deletion.lease_lost}"
            deletion.failed.update((path, why) for path in paths[start:])
            break
        delete_batch(list(paths[start : start + DELETE_BATCH]), deletion)
    return deletion


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

    def delete_batch(batch: list[str], deletion: Deletion) -> None:
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
            return
        for path in batch:
            try:
                io.deleteFile(path)
            except Exception as exc:
                deletion.failed[path] = _describe(ctx, exc)

    return _batches(ctx, paths, delete_batch)


def delete_files_without_spark(ctx: OpContext, paths: Sequence[str]) -> Deletion:
    """Delete ``paths`` as :func:`delete_files` does, through the table's pyiceberg FileIO
    (no JVM). A local file's Hadoop checksum (``.name.crc`` beside it, which Hadoop's file
    system deletes with its file) goes too. A file already gone counts as deleted."""
    io = ctx.table.io

    def delete_batch(batch: list[str], deletion: Deletion) -> None:
        for path in batch:
            try:
                io.delete(path)
            except FileNotFoundError:
                pass
            except Exception as exc:
                deletion.failed[path] = _describe(ctx, exc)
                continue
            checksum = _local_checksum(path)
            if checksum is not None:
                with contextlib.suppress(OSError):
                    checksum.unlink(missing_ok=True)

    return _batches(ctx, paths, delete_batch)


def _local_checksum(uri: str) -> Path | None:
    """The Hadoop checksum file of a local ``uri`` (``file:/x/y`` or ``/x/y``:
    ``/x/.y.crc``); None for other stores."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        return None
    path = Path(parsed.path)
    return path.with_name(f".{path.name}.crc")
