"""The registry of operations: the one list the CLI, the Dagster steps, the planner,
the log and the metadata all read, in the order a full pass runs them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from icegate_dagster.errors import IcegateError
from icegate_dagster.maintenance.ops.base import Operation


class Registry:
    """Operations by name, in pass order. Consumers read it when they run (the Dagster
    asset when it is built), so an operation registered before that shows up there."""

    def __init__(self, operations: Iterable[Operation]) -> None:
        self._operations: list[Operation] = []
        for operation in operations:
            self._add(operation, len(self._operations))

    def _add(self, operation: Operation, index: int) -> None:
        from icegate_dagster.config import TableSettings

        if operation.name in self.names():
            raise IcegateError(f"operation {operation.name!r} is registered twice")
        block = operation.settings_block
        if block and block not in TableSettings.model_fields:
            raise IcegateError(
                f"operation {operation.name!r}: settings_block {block!r} is not a block of "
                f"TableSettings (blocks: {', '.join(TableSettings.model_fields)})"
            )
        self._operations.insert(index, operation)

    def __iter__(self) -> Iterator[Operation]:
        return iter(tuple(self._operations))

    def names(self) -> tuple[str, ...]:
        """The operations' names, in pass order."""
        return tuple(operation.name for operation in self._operations)

    def get(self, name: str) -> Operation:
        """The operation called ``name``; an error naming the known ones otherwise."""
        for operation in self._operations:
            if operation.name == name:
                return operation
        raise IcegateError(f"operation {name!r} is unknown (known: {', '.join(self.names())})")

    def cli_commands(self) -> dict[str, Operation]:
        """``icegate-maintain`` subcommands that run one operation only."""
        return {op.cli_command: op for op in self._operations if op.cli_command is not None}

    def metadata_sums(self) -> dict[str, str]:
        """Output figures summed into each partition's metadata and the CLI's table, in
        pass order: key -> column title."""
        return {key: title for op in self._operations for key, title in op.metadata_sums.items()}

    @contextlib.contextmanager
    def registered(self, operation: Operation, *, before: str | None = None) -> Iterator[None]:
        """``operation`` registered for the duration of the block (last, or ahead of
        ``before``): how a test or a plug-in adds one without editing this package."""
        index = self.names().index(before) if before is not None else len(self._operations)
        self._add(operation, index)
        try:
            yield
        finally:
            self._operations.remove(operation)
