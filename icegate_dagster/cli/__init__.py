"""``icegate-maintain``: the maintenance pass from a shell.

- :mod:`.parser`: the whole command line and its exit codes (the CLI reference is
  generated from it);
- :mod:`.dispatch`: which command runs; :func:`main`, the entry point;
- the commands: :mod:`.passes` (``run``, one operation alone, ``rollback``),
  :mod:`.status` (``discover``, ``status``), :mod:`.orphans` (deferred orphan deletion),
  :mod:`.migrate`, :mod:`.serve` (the exporter), :mod:`.demo` (the demo lakehouse);
- :mod:`.history`: a pass recorded in a Dagster instance, as a run records it.

``main`` is named here because ``pyproject.toml`` points the ``icegate-maintain`` script at
``icegate_dagster.cli:main``.
"""

from icegate_dagster.cli.dispatch import main

__all__ = ["main"]
