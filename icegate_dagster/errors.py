"""The project's own errors: one root type, each message naming the value and the rule broken."""

from __future__ import annotations

from collections.abc import Callable


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


class SchemaConflictError(OperationError):
    """An existing table has a column whose type is not the one IceGate expects."""


def describe_error(exc: BaseException, clean: Callable[[str], str] | None = None) -> str:
    """One readable line for an error, Java root cause included, no stack trace.

    ``clean`` (secret masking) is applied before the line is cut to 1,000 characters, so
    a cut can never leave part of a secret that masking would no longer recognise.
    """

    def first_line(text: str) -> str:
        return next((line.strip() for line in text.splitlines() if line.strip()), "")

    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            top = first_line(str(java.toString()))
            root = java
            while root.getCause() is not None:
                root = root.getCause()
            bottom = first_line(str(root.toString()))
            text = top if bottom == top else f"{top}; caused by {bottom}"
        except Exception:  # the gateway may be gone; fall back to Python's text
            text = first_line(str(exc))
    else:
        text = first_line(str(exc)) or type(exc).__name__
        if not isinstance(exc, OperationError) and type(exc).__name__ not in text:
            text = f"{type(exc).__name__}: {text}"
    if clean is not None:
        text = clean(text)
    return text if len(text) <= 1000 else text[:997] + "..."
