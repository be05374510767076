"""The lakehouse as a Dagster resource: ``icegate.yaml``, the catalog it names, and the
run's heartbeat in the lease store."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg
from pydantic import PrivateAttr

from icegate_dagster.catalog import open_catalog
from icegate_dagster.config import IcegateConfig, load_config, resolve_config_path
from icegate_dagster.config.secrets import scrub
from icegate_dagster.errors import IcegateError, describe_error
from icegate_dagster.maintenance import Maintainer
from icegate_dagster.maintenance.leases.holder import lease_store
from icegate_dagster.maintenance.leases.store import holder_description
from icegate_dagster.resources.spark import SparkResource

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyspark.sql import SparkSession


class LakehouseResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """Where the lakehouse is described.

    ``config_path`` names an ``icegate.yaml``; unset, the usual lookup applies
    at run time (``$ICEGATE_CONFIG``, ``./icegate.yaml``, the embedded default).
    Secrets belong in the environment: ``${VAR}`` in the file, or
    ``dg.EnvVar("ICEGATE_CONFIG")`` here.
    """

    config_path: str | None = None
    _config: IcegateConfig | None = PrivateAttr(default=None)
    _catalog: Catalog | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """In a run, keep a heartbeat in the lease store for as long as this process lives
        and the run is not over, so a run whose worker died is recognized (see
        ``icegate_dagster.sensors.healing``). Sensors and schedules start none.

        A configuration or catalog that cannot be opened is left to the steps, which report
        it table by table; a lease store that cannot be reached (its first heartbeat retried
        for 30 s) fails the run here, saying why: a run nobody can see alive must not run."""
        run = context.run
        if run is None:
            return
        instance = context.instance
        run_id = run.run_id

        def running() -> bool:
            current = instance.get_run_by_id(run_id) if instance is not None else None
            return current is not None and not current.is_finished

        try:
            config, catalog = self.config(), self.catalog()
        except Exception as exc:  # the steps report a broken config or catalog themselves
            if context.log is not None:
                error = describe_error(exc, self._scrub)
                context.log.warning(f"no heartbeat for this run in the lease store: {error}")
            return
        try:
            store = lease_store(config, catalog)
            if store is not None:
                store.start_heartbeat(run_id, holder_description(run_id), running)
        except Exception as exc:
            raise IcegateError(
                "this run cannot keep its heartbeat in the lease store, so a healer could not "
                f"tell it from a dead run; it does not start: {describe_error(exc, self._scrub)}"
            ) from None

    def _scrub(self, text: str) -> str:
        return scrub(text, self._config) if self._config is not None else text

    def config(self) -> IcegateConfig:
        """The validated configuration: read again only when its file or the environment
        changed (a sensor's resource is made anew for each tick)."""
        if self._config is None:
            path = resolve_config_path(self.config_path)
            stat = path.stat() if path is not None else None
            key = (
                str(path.resolve()) if path is not None else f"embedded:{Path.cwd()}",
                (stat.st_mtime_ns, stat.st_size) if stat is not None else None,
                frozenset(os.environ.items()),  # ``${VAR}`` in the file
            )
            with _OPEN_LOCK:
                config = _LOADED_CONFIGS.get(key)
                if config is None:
                    config = load_config(self.config_path)
                    _LOADED_CONFIGS.clear()  # one configuration at a time is plenty
                    _LOADED_CONFIGS[key] = config
            self._config = config
        return self._config

    def catalog(self) -> Catalog:
        """The pyiceberg catalog, opened once per process and catalog settings: a sensor's
        code server evaluates it every 30 s, and opening a catalog (with its check) cost
        more than a steady tick's own work."""
        if self._catalog is None:
            settings = self.config().catalog
            key = json.dumps([settings.name, dict(sorted(settings.properties.items()))])
            with _OPEN_LOCK:
                catalog = _OPEN_CATALOGS.get(key)
                if catalog is None:
                    catalog = open_catalog(settings)
                    _OPEN_CATALOGS[key] = catalog
            self._catalog = catalog
        return self._catalog

    def maintainer(self, run_id: str, spark: SparkResource | None = None) -> Maintainer:
        """A :class:`Maintainer` for this run; Spark starts only if an operation needs it."""
        config = self.config()
        # Without a Spark resource, a step must not start a JVM behind Dagster's back.
        provider = _no_spark if spark is None else (lambda: spark.session(config))
        return Maintainer(config, catalog=self.catalog(), run_id=run_id, spark=provider)


#: The configuration last loaded, by its file, the file's version and the environment.
_LOADED_CONFIGS: dict[tuple[object, ...], IcegateConfig] = {}
#: The catalogs this process opened, by their settings (see ``LakehouseResource.catalog``).
_OPEN_CATALOGS: dict[str, Catalog] = {}
_OPEN_LOCK = threading.Lock()


def _no_spark() -> SparkSession:
    raise IcegateError("this step has no Spark resource; only metadata work is allowed here")
