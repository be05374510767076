"""Tables for people: one renderer for the CLI's text and the Dagster metadata's markdown."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from tabulate import tabulate

from icegate_dagster.config import format_bytes
from icegate_dagster.maintenance.ops import OPERATIONS
from icegate_dagster.maintenance.results import TableResult, TableStats

if TYPE_CHECKING:
    from icegate_dagster.maintenance.health.score import TableHealth
    from icegate_dagster.maintenance.sharing import Sharing


def text_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Aligned columns under a dashed header, as a terminal shows them."""
    text: str = tabulate(rows, headers, tablefmt="simple", disable_numparse=True, stralign="left")
    return text


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table, unpadded (the UI collapses long metadata, so no byte is wasted);
    a ``|`` or line break in a cell cannot break it."""

    def line(cells: Sequence[object]) -> str:
        return "| " + " | ".join(str(c).replace("|", "/").replace("\n", " ") for c in cells) + " |"

    return "\n".join([line(headers), "|" + "---|" * len(headers), *map(line, rows)])


def _arrow(before: int | None, after: int | None, fmt: Callable[[int], str] = str) -> str:
    if before is None:
        return "?"
    if after is None or after == before:
        return fmt(before)
    return f"{fmt(before)} -> {fmt(after)}"


def output_sum(result: TableResult, key: str) -> int:
    """One output figure (``orphans_removed``...) summed over a table's operations."""
    return sum(int(op.output.get(key, 0)) for op in result.ops)


def before_after(results: Sequence[TableResult]) -> str:
    """The before/after table a person reads at a glance (with a column for every figure
    the registered operations sum, such as WAL files ingested and orphans removed)."""
    sums = OPERATIONS.metadata_sums()
    rows = []
    for r in results:
        b, a = r.before, r.after
        failed = [op.operation for op in r.ops if op.status == "failed"]
        state = "ok" if r.ok else ("FAILED: " + ", ".join(failed) if failed else "FAILED")
        rows.append(
            [
                r.table,
                _arrow(b.data_files if b else None, a.data_files if a else None),
                _arrow(b.data_bytes if b else None, a.data_bytes if a else None, format_bytes),
                _arrow(b.snapshots if b else None, a.snapshots if a else None),
                # Rows a reader sees ("?" where a table with delete files was not counted).
                _arrow(b.live_rows if b else None, a.live_rows if a else None),
                *(str(output_sum(r, key)) for key in sums),
                f"{r.duration_s:.1f}s",
                state,
            ]
        )
    headers = ["table", "data files", "bytes", "snapshots", "rows", *sums.values()]
    headers += ["time", "status"]
    return text_table(headers, rows)


def op_lines(results: Sequence[TableResult]) -> str:
    """One line per table and operation."""
    lines = []
    for r in results:
        if r.error:
            lines.append(f"{r.table}: FAILED: {r.error}")
        for op in r.ops:
            lines.append(
                f"{r.table} {op.operation}: {op.status} ({op.duration_s:.1f}s) {op.details}"
            )
    return "\n".join(lines)


#: Due operations as the ``status`` text table names them (``--json`` has the full names).
SHORT_OPERATION_NAMES: Mapping[str, str] = {
    "wal_compaction": "wal",
    "optimize": "optimize",
    "rewrite_position_delete_files": "pos-deletes",
    "rewrite_manifests": "manifests",
    "expire_snapshots": "expire",
}


def status_table(
    stats: Sequence[tuple[str, TableStats | None, str | None]],
    health: Mapping[str, TableHealth] | None = None,
    sharing: Mapping[str, Sharing] | None = None,
) -> str:
    """Current state of each table; with ``health`` (by table), its score and due operations
    (``excluded`` for a table excluded from maintenance); the last column says why, what is
    left to another optimizer, whose location it shares (``sharing``) and any error."""
    health = health or {}
    sharing = sharing or {}
    rows: list[list[object]] = []
    for name, s, error in stats:
        h = health.get(name)
        score = f"{h.score:g}" if h is not None else "-"
        if h is None:
            due = "-"
        elif h.excluded is not None:
            due = "excluded"
        else:
            due = ", ".join(SHORT_OPERATION_NAMES.get(op, op) for op in h.due_operations) or "-"
        notes = []
        if h is not None and h.excluded is not None:
            notes.append(h.excluded)
        elif h is not None and h.excluded_operations:
            reasons = sorted(set(h.excluded_operations.values()))
            notes.append(f"{', '.join(sorted(h.excluded_operations))}: {'; '.join(reasons)}")
        shared = sharing.get(name)
        if shared is not None and shared.shared:
            gc = "" if shared.gc_disabled else ", without gc.enabled=false (see below)"
            notes.append(f"shares its location with {', '.join(shared.overlapping)}{gc}")
        if error:
            notes.append(f"error: {error}")
        note = "; ".join(notes)
        if s is None:
            rows.append([name, "-", "-", "-", "-", "-", "-", "-", score, due, note])
            continue
        rows.append(
            [
                name,
                s.data_files,
                s.small_files,
                s.delete_files,
                format_bytes(s.data_bytes),
                s.snapshots,
                s.manifests,
                s.rows,
                score,
                due,
                note,
            ]
        )
    headers = ["table", "data files", "small", "deletes", "bytes", "snapshots", "manifests"]
    headers += ["rows", "score", "due", ""]
    return text_table(headers, rows)


def ops_markdown(result: TableResult) -> str:
    """A partition's operations as a markdown table (the ``ops`` metadata)."""

    def files(stats: TableStats | None) -> str:
        return str(stats.data_files) if stats is not None else "?"

    rows = [
        [
            op.operation,
            op.status,
            f"{op.duration_s:.1f}s",
            f"{files(op.before)} → {files(op.after)}",
            op.details,
        ]
        for op in result.ops
    ]
    return markdown_table(["operation", "status", "time", "data files", "details"], rows)
