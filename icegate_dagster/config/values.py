"""Value types of the configuration: sizes, durations and sort orders, and their parsing.

Each parser raises a ``ValueError`` stating the rule; the models turn it into a
:class:`~icegate_dagster.errors.ConfigError` naming the key and the value.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated

from pydantic import BeforeValidator

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1024,
    "kib": 1024,
    "mb": 1024**2,
    "mib": 1024**2,
    "gb": 1024**3,
    "gib": 1024**3,
    "tb": 1024**4,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_DURATION_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
_DURATION_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([smhd])\s*$")
_SORT_TERM = r"[A-Za-z_][A-Za-z0-9_.]*(\s+(ASC|DESC))?(\s+NULLS\s+(FIRST|LAST))?"
_SORT_ORDER = re.compile(
    rf"^\s*(zorder\(\s*[A-Za-z_][A-Za-z0-9_.]*(\s*,\s*[A-Za-z_][A-Za-z0-9_.]*)*\s*\)"
    rf"|{_SORT_TERM}(\s*,\s*{_SORT_TERM})*)\s*$",
    re.IGNORECASE,
)


def parse_size(value: object) -> int:
    """Parse a size: a whole number of bytes, or a string such as ``10MB`` (1 MB = 1024**2 B)."""
    if isinstance(value, bool):
        raise ValueError("must be a size such as 10MB or a number of bytes, not a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must not be negative")
        return value
    if isinstance(value, str):
        match = _SIZE_RE.match(value)
        if match and match.group(2).lower() in _SIZE_UNITS:
            return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])
        if value.strip().startswith("-"):
            raise ValueError("must not be negative")
    raise ValueError("must be a size such as 10MB, 512KB, 1GB or a number of bytes")


def parse_duration(value: object) -> timedelta:
    """Parse a positive duration written as ``30s``, ``15m``, ``12h`` or ``7d``."""
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, str) and (match := _DURATION_RE.match(value)):
        result = timedelta(**{_DURATION_UNITS[match.group(2)]: float(match.group(1))})
    else:
        raise ValueError("must be a duration such as 30s, 15m, 12h or 7d")
    if result <= timedelta(0):
        raise ValueError("must be a positive duration")
    return result


def format_duration(value: timedelta) -> str:
    """Render a duration back in the config's own notation (``7d``, ``36h``, ``90s``)."""
    seconds = int(value.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def format_bytes(value: int) -> str:
    """A byte count for people: ``1536`` -> ``1.5 KB`` (messages and tables, not config)."""
    size = float(value)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{value} B"


def validate_sort_order(text: str) -> str:
    """Accept ``zorder(a, b)`` or ``a ASC NULLS LAST, b DESC``; anything else is refused.

    The sort order reaches a Spark SQL procedure, so only plain column names pass. The
    ``ValueError`` states the rule; the error built from it names the key.
    """
    if not _SORT_ORDER.match(text):
        raise ValueError(
            "must be zorder(col, ...) or "
            "'col [ASC|DESC] [NULLS FIRST|LAST], ...' with plain column names"
        )
    return text.strip()


Size = Annotated[int, BeforeValidator(parse_size)]
Duration = Annotated[timedelta, BeforeValidator(parse_duration)]
