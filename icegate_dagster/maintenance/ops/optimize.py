"""``optimize``: compact small data files with ``rewrite_data_files`` (binpack or sort),
and apply delete files by rewriting the data files they delete from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from icegate_dagster.errors import OperationError
from icegate_dagster.maintenance.identifiers import sql_string
from icegate_dagster.maintenance.ops.base import OpContext, Operation
from icegate_dagster.maintenance.ops.procedures import call_procedure, committing, options_map
from icegate_dagster.maintenance.results import Outcome

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from icegate_dagster.config import OptimizeSettings

#: Iceberg's default ``write.target-file-size-bytes``.
DEFAULT_TARGET_FILE_SIZE = 512 * 1024**2


def rewrite_options(
    settings: OptimizeSettings, table: Table, *, delete_files: int = 0
) -> dict[str, str]:
    """Map the ``optimize`` settings onto ``rewrite_data_files`` options.

    Files smaller than the threshold are candidates (``min-file-size-bytes``);
    a group is rewritten once it has ``min_input_files`` of them. The target
    size stays the table's own unless the threshold would reach it, in which
    case it is raised to twice the threshold (Iceberg requires min < target).
    A data file with ``delete_file_threshold`` delete files, or whose deleted rows reach
    ``delete_ratio_threshold`` of its rows, is rewritten whatever its size, its deletes
    applied (``delete-file-threshold``, ``delete-ratio-threshold``). Where the table has
    ``delete_files``, Iceberg also drops the delete files left applying to no data file
    by sequence number (``remove-dangling-deletes``: equality deletes, and position deletes
    older than every data file of their partition; ``rewrite_position_delete_files``
    finds the others by path).
    """
    target = int(table.properties.get("write.target-file-size-bytes", DEFAULT_TARGET_FILE_SIZE))
    options = {
        "min-input-files": str(settings.min_input_files),
        "min-file-size-bytes": str(settings.file_size_threshold),
        "delete-file-threshold": str(settings.delete_file_threshold),
        "delete-ratio-threshold": str(settings.delete_ratio_threshold),
        # Not "partial-progress.enabled": it commits the groups that worked and only logs
        # the ones that failed (a missing file, say), so the op would report success.
        # Conflicts with writers are retried instead (see call_procedure).
    }
    if settings.file_size_threshold >= target:
        options["target-file-size-bytes"] = str(2 * settings.file_size_threshold)
    if delete_files:
        options["remove-dangling-deletes"] = "true"
    if settings.max_file_group_size is not None:
        options["max-file-group-size-bytes"] = str(settings.max_file_group_size)
    return options


#: The table property Iceberg's Parquet writer reads its codec from.
CODEC_PROPERTY = "write.parquet.compression-codec"
#: ... and its level.
LEVEL_PROPERTY = "write.parquet.compression-level"
#: The zstd level set beside the codec on a table that sets neither: what pyiceberg and
#: Arrow write. Measured on 0.4 GB in 200 files (cold ``optimize``, 2 each): 37.3-38.3 s
#: against 46.0-49.3 s at parquet-java's default level 3 (docs/performance.md).
ZSTD_LEVEL = "1"


def codec_to_set(settings: OptimizeSettings, table: Table) -> str | None:
    """The codec to set on ``table`` before rewriting it: ``compression_codec`` when the
    table sets none (Iceberg's writer would fall back to gzip), else ``None``."""
    if settings.compression_codec is None or CODEC_PROPERTY in table.properties:
        return None
    return settings.compression_codec


def compression_to_set(settings: OptimizeSettings, table: Table) -> dict[str, str]:
    """The properties to set on ``table`` before rewriting it: :func:`codec_to_set`'s codec,
    with :data:`ZSTD_LEVEL` when that is zstd and the table sets no level of its own; none
    on a table that sets its codec (its own choice, level included, stays)."""
    codec = codec_to_set(settings, table)
    if codec is None:
        return {}
    wanted = {CODEC_PROPERTY: codec}
    if codec == "zstd" and LEVEL_PROPERTY not in table.properties:
        wanted[LEVEL_PROPERTY] = ZSTD_LEVEL
    return wanted


def _set_properties(java_table: Any, properties: dict[str, str]) -> None:
    update = java_table.updateProperties()
    for key, value in properties.items():
        update = update.set(key, value)
    update.commit()


def _set_properties_in_sql(ctx: OpContext, properties: dict[str, str]) -> None:
    """The same commit through Spark SQL (Spark Connect: no Java table API here)."""
    pairs = ", ".join(f"{sql_string(k)} = {sql_string(v)}" for k, v in properties.items())
    identifier = ctx.ref.spark_identifier(ctx.catalog_name)
    ctx.spark().sql(f"ALTER TABLE {identifier} SET TBLPROPERTIES ({pairs})").collect()


class Optimize(Operation):
    """Small files rewritten into few, partition by partition."""

    name = "optimize"
    description = "Compact small data files with Iceberg's rewrite_data_files (Spark)."
    settings_block = "optimize"
    cli_command = "optimize"

    def _candidates(self, ctx: OpContext) -> str:
        rule, before = ctx.settings.optimize, ctx.before
        text = (
            f"{before.compactable_files} small files would be rewritten "
            f"({before.small_files} of {before.data_files} data files are under "
            f"{rule.file_size_threshold} bytes; a partition needs "
            f"{rule.min_input_files} of them)"
        )
        if before.delete_files:
            text += (
                f"; {before.delete_rewrite_files} data files to rewrite for their deletes "
                f"({before.delete_files} delete files, {before.dangling_delete_files} of the "
                f"position delete files dangling; a file needs {rule.delete_file_threshold} or "
                f"{rule.delete_ratio_threshold:.0%} of its rows deleted)"
            )
        return text

    def plan(self, ctx: OpContext) -> str | None:
        # Dangling delete files apply to no data file: rewriting data would not drop them,
        # rewrite_position_delete_files does (it runs next).
        if ctx.before.compactable_files == 0 and ctx.before.delete_rewrite_files == 0:
            return "nothing to compact: " + self._candidates(ctx)
        return None

    def run(self, ctx: OpContext) -> Outcome:
        if ctx.dry_run:
            return Outcome.skip("dry run: " + self._candidates(ctx))
        rule = ctx.settings.optimize
        args = {"table": ctx.ref.procedure_argument(), "strategy": sql_string(rule.strategy)}
        if rule.strategy == "sort":
            if rule.sort_order:
                args["sort_order"] = sql_string(rule.sort_order)
            elif ctx.table.sort_order().is_unsorted:
                raise OperationError(
                    f"table {ctx.ref.key}: optimize.strategy is 'sort' but the table has no "
                    "sort order; set optimize.sort_order (e.g. 'zorder(tenant_id, timestamp)')"
                )
        options = rewrite_options(rule, ctx.table, delete_files=ctx.before.delete_files)
        args["options"] = options_map(options)
        compression = compression_to_set(rule, ctx.table)
        if compression:
            # Through Spark's own view of the table: where Spark cannot start or cannot
            # open the table, this fails before anything is committed.
            if ctx.on_connect:
                committing(lambda: _set_properties_in_sql(ctx, compression))
            else:
                committing(lambda: _set_properties(ctx.java_table(), compression))
        row = call_procedure(ctx.spark(), ctx.catalog_name, "rewrite_data_files", args).output()
        details = (
            f"rewrote {row['rewritten_data_files_count']} data files "
            f"({row['rewritten_bytes_count']} bytes) into {row['added_data_files_count']}"
        )
        if ctx.before.delete_files:
            # Not Iceberg's removed_delete_files_count: file-scoped deletes of rewritten
            # files are dropped at commit without being counted there (12 -> 6 reported 0).
            details += f", applying their deletes ({ctx.before.delete_files} delete files before)"
        if compression:
            settings = ", ".join(f"{key}={value}" for key, value in compression.items())
            details += f"; set {settings} first (the table set no codec)"
            row["compression_codec_set"] = compression[CODEC_PROPERTY]
            if LEVEL_PROPERTY in compression:
                row["compression_level_set"] = int(compression[LEVEL_PROPERTY])
        return Outcome("completed", details, row)
