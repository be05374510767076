"""Markdown the generated references share: table cells and tables."""

from __future__ import annotations

import html
import re

_CODE_SPAN = re.compile(r"(`[^`]*`)")


def cell(text: str | None) -> str:
    """``text`` fit for one table cell: one line, ``|`` escaped, and ``<`` outside code
    spans escaped (``<namespace>`` would otherwise be read as an HTML tag and vanish)."""
    parts = _CODE_SPAN.split((text or "").replace("\n", " ").strip())
    text = "".join(
        part if part.startswith("`") else html.escape(part, quote=False) for part in parts
    )
    return text.replace("|", "\\|")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table, then a blank line."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(cell(value) for value in row) + " |" for row in rows),
        "",
    ]
