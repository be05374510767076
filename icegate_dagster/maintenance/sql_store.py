"""The deployment's shared SQL database: one engine per URI, the database's clock, upserts
and the small schema changes older deployments need (SQLite, PostgreSQL, MySQL/MariaDB).

The lease store (:mod:`.leases`) and the trigger's memory (:mod:`.memory`) keep their
tables here. Times are epoch seconds as 8-byte floats (``DOUBLE``): a 4-byte ``FLOAT``
(MySQL's reading of SQLAlchemy's plain ``Float``) keeps 24 bits, about 128 s at today's
epoch, so a lease renewed "until now + 2 min" could be stored a minute short.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from icegate_dagster.errors import IcegateError

#: Dialects whose clock and upserts this module knows.
SUPPORTED = ("sqlite", "postgresql", "mysql", "mariadb")

_engines: dict[str, Any] = {}
_engines_lock = threading.Lock()


def engine_for(uri: str) -> Any:
    """One SQLAlchemy engine per URI per process (SQLite files get their folder and a
    30 s busy timeout; servers a pre-ping, so a connection a failover broke is replaced)."""
    from pathlib import Path

    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    with _engines_lock:
        engine = _engines.get(uri)
        if engine is None:
            url = make_url(uri)
            if url.get_backend_name() == "sqlite" and url.database:
                Path(url.database).parent.mkdir(parents=True, exist_ok=True)
                engine = create_engine(url, connect_args={"timeout": 30})
            else:
                engine = create_engine(url, pool_pre_ping=True)
            _engines[uri] = engine
        return engine


def db_now(dialect: str) -> Any:
    """The database's current time in epoch seconds (microseconds kept), as a SQL expression."""
    from sqlalchemy import literal_column

    if dialect == "sqlite":
        return literal_column("((julianday('now') - 2440587.5) * 86400.0)")
    if dialect == "postgresql":
        # One instant per statement (a lease's start and end agree), fresh per statement
        # (unlike now(), which a long transaction would hold back).
        return literal_column("extract(epoch from statement_timestamp())")
    if dialect in ("mysql", "mariadb"):
        # UNIX_TIMESTAMP of a DATETIME(6) is a DECIMAL with microseconds: exact in a DOUBLE.
        return literal_column("UNIX_TIMESTAMP(NOW(6))")
    raise IcegateError(
        f"maintain.locks.uri: the {dialect!r} database cannot keep leases "
        f"(supported: {', '.join(SUPPORTED[:3])})"
    )


def epoch_type() -> Any:
    """The column type of an instant: an 8-byte float on every dialect."""
    from sqlalchemy import Double

    return Double()


def upsert(
    conn: Any,
    table: Any,
    rows: Sequence[Mapping[str, Any]],
    keys: Sequence[str],
    update: Sequence[str] | None = None,
) -> None:
    """Insert ``rows``, or update the columns ``update`` (default: every non-key column of
    the row) of the rows whose ``keys`` exist, in one statement per dialect."""
    if not rows:
        return
    dialect = conn.dialect.name
    columns = list(update) if update is not None else [c for c in rows[0] if c not in keys]
    statement: Any
    if dialect in ("mysql", "mariadb"):
        from sqlalchemy.dialects import mysql

        statement = mysql.insert(table)
        statement = statement.on_duplicate_key_update({c: statement.inserted[c] for c in columns})
    elif dialect in ("postgresql", "sqlite"):
        from sqlalchemy.dialects import postgresql, sqlite

        statement = (postgresql if dialect == "postgresql" else sqlite).insert(table)
        if columns:
            statement = statement.on_conflict_do_update(
                index_elements=list(keys), set_={c: statement.excluded[c] for c in columns}
            )
        else:
            statement = statement.on_conflict_do_nothing(index_elements=list(keys))
    else:
        raise IcegateError(f"cannot write to a {dialect!r} database (supported: {SUPPORTED})")
    conn.execute(statement, [dict(row) for row in rows])


def create_tables(engine: Any, metadata: Any, names: Sequence[str]) -> None:
    """Create the tables of ``metadata`` that are missing (another process creating them at
    the same moment is fine), then bring older ones up to date: add missing nullable
    columns, and widen 4-byte float instants to ``DOUBLE`` on MySQL."""
    from sqlalchemy import inspect

    try:
        metadata.create_all(engine, checkfirst=True)
    except Exception:
        found = inspect(engine)
        if not all(found.has_table(name) for name in names):
            raise
    _upgrade(engine, metadata, names)


def _upgrade(engine: Any, metadata: Any, names: Sequence[str]) -> None:
    from sqlalchemy import Double, inspect, text

    mysql = engine.dialect.name in ("mysql", "mariadb")
    for name in names:
        table = metadata.tables[name]
        present = {column["name"]: column for column in inspect(engine).get_columns(name)}
        for column in table.columns:
            ddl_type = column.type.compile(dialect=engine.dialect)
            if column.name not in present:
                statement = f"ALTER TABLE {name} ADD COLUMN {column.name} {ddl_type}"
            elif (
                mysql
                and isinstance(column.type, Double)
                and str(present[column.name]["type"]).upper().startswith("FLOAT")
            ):
                null = "NULL" if column.nullable else "NOT NULL"
                statement = f"ALTER TABLE {name} MODIFY COLUMN {column.name} {ddl_type} {null}"
            else:
                continue
            try:
                with engine.begin() as conn:
                    conn.execute(text(statement))
            except Exception:
                # Another process upgraded it at the same moment: fine if it is done now.
                now = {c["name"]: c for c in inspect(engine).get_columns(name)}
                if column.name not in now or str(now[column.name]["type"]).upper().startswith(
                    "FLOAT"
                ):
                    raise
