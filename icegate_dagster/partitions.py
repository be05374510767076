"""Every Iceberg table is a partition (key ``namespace.table``) of ``maintained_table``."""

import dagster as dg

ICEBERG_TABLES = "iceberg_tables"
iceberg_tables = dg.DynamicPartitionsDefinition(name=ICEBERG_TABLES)
