"""Dagster assets: ``maintained_table`` (one partition per table) and ``maintenance_log``."""

from icegate_dagster.assets.maintained_table import MAINTAINED_TABLE_CHECKS, maintained_table
from icegate_dagster.assets.maintenance_log import maintenance_log

__all__ = ["MAINTAINED_TABLE_CHECKS", "maintained_table", "maintenance_log"]
