"""Table names as data: parsing, validation and quoting for Spark SQL.

A table name never becomes SQL text unquoted: identifiers are back-quoted and
string literals escaped, and names carrying control characters are refused.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from icegate_dagster.errors import InvalidIdentifierError

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MAX_PART = 255


def validate_name_part(part: str, what: str) -> str:
    """Check one namespace or table name; return it unchanged or raise naming the rule."""
    if not part:
        raise InvalidIdentifierError(f"{what} {part!r}: must not be empty")
    if _CONTROL.search(part):
        raise InvalidIdentifierError(f"{what} {part!r}: must not contain control characters")
    if len(part) > _MAX_PART:
        raise InvalidIdentifierError(f"{what} {part[:40]!r}...: longer than {_MAX_PART} characters")
    return part


def quote_identifier(part: str) -> str:
    """Back-quote one identifier part for Spark SQL (back-quotes inside are doubled)."""
    return "`" + part.replace("`", "``") + "`"


def sql_string(text: str) -> str:
    """A Spark SQL string literal holding ``text`` exactly (backslash and quote escaped)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass(frozen=True, order=True)
class TableRef:
    """A table as ``namespace`` + ``name``; its key (``namespace.table``) names a partition."""

    namespace: str
    name: str

    def __post_init__(self) -> None:
        validate_name_part(self.namespace, "namespace")
        validate_name_part(self.name, "table name")

    @classmethod
    def parse(cls, text: str) -> TableRef:
        """Parse ``namespace.table``; the table part may itself contain dots."""
        if not isinstance(text, str) or "." not in text:
            raise InvalidIdentifierError(f"table {text!r}: must be written as namespace.table")
        return _parsed(text) if cls is TableRef else cls(*_split(text))

    @property
    def key(self) -> str:
        """``namespace.table``: the partition key and the name used in logs."""
        return f"{self.namespace}.{self.name}"

    @property
    def is_internal(self) -> bool:
        """Tables whose name starts with ``_`` (such as the log table) are never maintained."""
        return self.name.startswith("_")

    @property
    def identifier(self) -> tuple[str, str]:
        """The pyiceberg identifier tuple."""
        return (self.namespace, self.name)

    def spark_identifier(self, catalog: str) -> str:
        """Fully quoted ``catalog.namespace.table`` for Spark SQL and DataFrame APIs."""
        return ".".join(quote_identifier(p) for p in (catalog, self.namespace, self.name))

    def procedure_argument(self) -> str:
        """The ``table => ...`` argument of an Iceberg procedure: a literal of the quoted name."""
        return sql_string(f"{quote_identifier(self.namespace)}.{quote_identifier(self.name)}")

    def __str__(self) -> str:
        return self.key


def _split(text: str) -> tuple[str, str]:
    namespace, _, name = text.partition(".")
    return namespace, name


@functools.lru_cache(maxsize=100_000)
def _parsed(text: str) -> TableRef:
    """Parsed and checked once per name (the sensors parse every table at every tick)."""
    return TableRef(*_split(text))
