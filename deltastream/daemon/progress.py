"""A one-line progress bar on a terminal, for long catch-ups and large snapshots."""

from __future__ import annotations

import time
from typing import TextIO

__all__ = ["TerminalProgress"]


class TerminalProgress:
    """Draws ``[#####.....]  1234/10000 versions`` on ``out``, at most ten times a second,
    and only for work of at least ``minimum`` units (short rounds stay quiet)."""

    def __init__(self, out: TextIO, *, width: int = 30, minimum: int = 20) -> None:
        self.out = out
        self.width = width
        self.minimum = minimum
        self._last = 0.0
        self._drawn = False

    def __call__(self, what: str, done: int, total: int) -> None:
        if total < self.minimum:
            return
        now = time.monotonic()
        finished = done >= total
        if not finished and now - self._last < 0.1:
            return
        self._last = now
        filled = self.width * done // total
        bar = "#" * filled + "." * (self.width - filled)
        self.out.write(f"\r[{bar}] {done}/{total} {what}")
        self._drawn = True
        if finished:
            self.out.write("\n")
            self._drawn = False
        self.out.flush()
