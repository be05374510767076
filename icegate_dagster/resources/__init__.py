"""Dagster resources: the lakehouse (config + catalog) and the Spark session."""

from icegate_dagster.resources.lakehouse import LakehouseResource
from icegate_dagster.resources.spark import SparkResource

__all__ = ["LakehouseResource", "SparkResource"]
