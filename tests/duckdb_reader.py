"""DuckDB with its iceberg extension: a reader of Iceberg tables that shares no code with
Spark or pyiceberg (it applies position deletes and deletion vectors itself)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any


def duckdb_iceberg(s3: dict[str, str] | None = None) -> Any:
    """A DuckDB connection with the ``avro`` and ``iceberg`` extensions loaded from the
    ``duckdb-ext-*`` PyPI packages (no network): query with ``iceberg_scan(<metadata>)``.

    ``s3`` (``endpoint`` as ``http://host:port``, ``key_id``, ``secret``, ``region``) also
    loads ``httpfs`` and reads ``s3://`` from that server, path-style, as the one secret."""
    import duckdb

    spec = importlib.util.find_spec("duckdb_ext")
    assert spec is not None and spec.submodule_search_locations, "duckdb-ext-iceberg missing"
    [folder] = {
        path.parent
        for root in spec.submodule_search_locations
        for path in Path(root).glob(f"extensions/v{duckdb.__version__}/*/iceberg.duckdb_extension")
    }
    con = duckdb.connect()
    for extension in ("avro", "iceberg", *(("httpfs",) if s3 else ())):
        con.execute(f"LOAD '{folder / f'{extension}.duckdb_extension'}'")
    if s3:
        endpoint = s3["endpoint"]
        con.execute(
            "CREATE SECRET (TYPE s3, KEY_ID ?, SECRET ?, REGION ?, ENDPOINT ?, "
            "URL_STYLE 'path', USE_SSL ?)",
            [
                s3["key_id"],
                s3["secret"],
                s3["region"],
                endpoint.split("://", 1)[1],
                endpoint.startswith("https://"),
            ],
        )
    return con
