"""icegate_dagster: keeps every Iceberg table of a lakehouse healthy, from Dagster or the CLI."""

__version__ = "0.1.0"
