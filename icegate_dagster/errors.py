"""The project's own errors: one root type, each message naming the value and the rule broken."""

from __future__ import annotations


class IcegateError(Exception):
    """Root of every error this project raises on purpose.

    ``exit_code`` is what the CLI exits with when the error ends a command:
    1 for a failure of the work, 2 for bad usage or configuration.
    """

    exit_code = 1


class ConfigError(IcegateError):
    """The configuration is invalid; the message names the key and the value."""

    exit_code = 2


class InvalidIdentifierError(ConfigError):
    """A namespace or table name breaks a naming rule."""


class CatalogUnavailableError(IcegateError):
    """The catalog could not be reached or opened."""


class TableNotFoundError(IcegateError):
    """A table named by the user does not exist in the catalog."""


class SparkStartError(IcegateError):
    """The Spark session could not be started (missing jar, bad master, no Java)."""


class OperationError(IcegateError):
    """A maintenance operation cannot run on a table as configured."""
