"""Every process command line on the machine while something runs: where a secret must
never show (``ps`` is readable by every local user)."""

from __future__ import annotations

import subprocess
import threading


class PsSampler:
    """Every process command line on the machine, sampled every ~50 ms in a thread."""

    def __init__(self) -> None:
        self.lines: set[str] = set()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            out = subprocess.run(  # noqa: S603
                ["ps", "-ww", "-eo", "args"],  # noqa: S607
                capture_output=True,
                text=True,
                check=False,
            ).stdout
            self.lines.update(out.splitlines())
            self.samples += 1
            self._stop.wait(0.05)

    def __enter__(self) -> PsSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
