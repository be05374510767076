"""The step boundaries of a WAL compaction, where tests inject a crash.

A crash at any of them is survivable by design; the crash tests call a hook there,
or SIGKILL the whole process (JVM included) through an environment variable.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

#: The step boundaries of a compaction, where a crash is survivable by design.
CHECKPOINTS = ("before_write", "after_commit", "mid_delete", "after_delete")
#: Test-only: ``ICEGATE_TEST_KILL_AT=after_commit`` SIGKILLs the process at that checkpoint.
KILL_AT_ENV = "ICEGATE_TEST_KILL_AT"

#: Test-only: called with each checkpoint's name, and with ``before_commit`` right before
#: every commit and delete of any operation (see ``maintenance.leasing``).
FaultHook = Callable[[str], None]


def checkpoint(point: str, hook: FaultHook | None) -> None:
    """Call ``hook`` with ``point``, then SIGKILL the process if :data:`KILL_AT_ENV` names it."""
    if hook is not None:
        hook(point)
    if os.environ.get(KILL_AT_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)
