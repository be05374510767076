"""Driver-side (Iceberg's table API) vs. distributed procedure, for expiry and manifest
rewrite, on tables of N appends (N files, N snapshots, N manifests): where the limits in
``icegate_dagster.maintenance.iceberg_java`` come from.

Usage: ``.venv/bin/python -m bench.driver_side [N ...]`` (default 50 200). One warm Spark
session for all sizes, each method on its own copy of the table: relative figures only,
labelled as such. Building a table costs O(N^2) with pyiceberg appends.

The expiry tables end with one commit deleting every other data file, so an expiry that
keeps the last snapshot frees N/2 data files as well as N-1 manifest lists and the
manifests only expired snapshots list. Expiry is timed three ways: Iceberg's
``expireSnapshots().commit()`` with its own (incremental) file cleanup (``expire_driver_s``),
the ``expire_snapshots`` procedure (``expire_procedure_s``), and the project's
``expire_snapshots`` operation as a pass runs it on a table this small, on the driver
(``expire_op_s``: the operation's own duration, lease and planning included; run this
module from another checkout's folder to time another version of the operation).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from pyiceberg.expressions import In

from icegate_dagster.catalog import open_catalog
from icegate_dagster.config import config_from_dict
from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.maintenance.iceberg_java import java_table, one_cluster
from icegate_dagster.spark.session import get_spark

SCHEMA = pa.schema([("id", pa.int64()), ("body", pa.string())])
FAR = "TIMESTAMP '2999-01-01 00:00:00+00:00'"


def main(argv: list[str]) -> int:
    sizes = [int(x) for x in argv] or [50, 200]
    root = Path(tempfile.mkdtemp(prefix="icegate-driver-side-"))
    try:
        uri, warehouse = f"sqlite:///{root}/c.db", (root / "wh").as_uri()
        expire = {"retention_threshold": "1s", "retain_last": 1}
        config = config_from_dict(
            {
                "catalog": {"name": "xo", "uri": uri, "warehouse": warehouse},
                "maintain": {"expire_snapshots": expire, "log_table": "ns._log"},
            },
            root,
        )
        catalog = open_catalog(config.catalog)
        catalog.create_namespace_if_not_exists("ns")

        def build(name: str, appends: int) -> None:
            table = catalog.create_table(("ns", name), schema=SCHEMA)
            for i in range(appends):
                table.append(pa.table({"id": [i] * 20, "body": [f"x{i}"] * 20}, schema=SCHEMA))
            if name.endswith(f"exp_{appends}"):  # one commit deleting every other file
                table.delete(In("id", list(range(1, appends, 2))))

        for n in [5, *sizes]:
            for method in ("drv_exp", "proc_exp", "op_exp", "drv_rm", "proc_rm"):
                build(f"{method}_{n}", n)
        spark = get_spark(config)
        maintainer = Maintainer(config)
        time.sleep(1.1)  # every snapshot older than the operation's 1 s threshold
        for n in [5, *sizes]:  # 5: warm-up of both paths, not printed
            cutoff = int(time.time() * 1000) + 1000
            started = time.perf_counter()
            expiry = java_table(spark, f"xo.ns.drv_exp_{n}", "xo").expireSnapshots()
            expiry.expireOlderThan(cutoff).retainLast(1).commit()
            expire_driver = time.perf_counter() - started
            started = time.perf_counter()
            spark.sql(
                f"CALL xo.system.expire_snapshots(table => 'ns.proc_exp_{n}', "
                f"older_than => {FAR}, retain_last => 1)"
            ).collect()
            expire_procedure = time.perf_counter() - started
            [op] = maintainer.maintain_table(
                TableRef("ns", f"op_exp_{n}"), ["expire_snapshots"], write_log=False
            ).ops
            assert op.status == "completed" and op.output["execution"] == "driver", op
            started = time.perf_counter()
            rewrite = java_table(spark, f"xo.ns.drv_rm_{n}", "xo").rewriteManifests()
            rewrite.clusterBy(one_cluster(spark)).commit()
            rewrite_driver = time.perf_counter() - started
            started = time.perf_counter()
            spark.sql(f"CALL xo.system.rewrite_manifests(table => 'ns.proc_rm_{n}')").collect()
            rewrite_procedure = time.perf_counter() - started
            if n in sizes:
                row = {
                    "appends": n,
                    "expire_driver_s": round(expire_driver, 3),
                    "expire_procedure_s": round(expire_procedure, 3),
                    "expire_op_s": round(op.duration_s, 3),
                    "expire_op_files_freed": op.output.get("files_freed"),
                    "rewrite_manifests_driver_s": round(rewrite_driver, 3),
                    "rewrite_manifests_procedure_s": round(rewrite_procedure, 3),
                }
                print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
