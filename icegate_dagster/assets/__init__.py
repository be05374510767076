"""Dagster assets: ``maintained_table`` (one partition per table), ``maintenance_log`` and
``lakehouse_health``."""

from icegate_dagster.assets.lakehouse_health import lakehouse_health
from icegate_dagster.assets.maintained_table import MAINTAINED_TABLE_CHECKS, maintained_table
from icegate_dagster.assets.maintenance_log import maintenance_log

__all__ = ["MAINTAINED_TABLE_CHECKS", "lakehouse_health", "maintained_table", "maintenance_log"]
