"""The lakehouse as a Dagster resource: ``icegate.yaml`` and the catalog it names."""

from __future__ import annotations

import dagster as dg
from pydantic import PrivateAttr

from icegate_dagster.config import IcegateConfig, load_config
from icegate_dagster.maintenance import Maintainer
from icegate_dagster.resources.spark import SparkResource


class LakehouseResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """Where the lakehouse is described.

    ``config_path`` names an ``icegate.yaml``; unset, the usual lookup applies
    at run time (``$ICEGATE_CONFIG``, ``./icegate.yaml``, the embedded default).
    Secrets belong in the environment: ``${VAR}`` in the file, or
    ``dg.EnvVar("ICEGATE_CONFIG")`` here.
    """

    config_path: str | None = None
    _config: IcegateConfig | None = PrivateAttr(default=None)

    def config(self) -> IcegateConfig:
        """The validated configuration, loaded once per resource instance."""
        if self._config is None:
            self._config = load_config(self.config_path)
        return self._config

    def maintainer(self, run_id: str, spark: SparkResource | None = None) -> Maintainer:
        """A :class:`Maintainer` for this run; Spark starts only if an operation needs it."""
        config = self.config()
        if spark is None:
            return Maintainer(config, run_id=run_id)
        return Maintainer(config, run_id=run_id, spark=lambda: spark.session(config))
