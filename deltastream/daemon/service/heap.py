"""Short garbage-collector pauses for a daemon holding thousands of streams.

CPython's full collections walk every object the collector tracks, and they stop the event
loop while they do. A daemon following 10,000 tables holds about 1.2 GiB of such objects,
nearly all of them living as long as their stream (its configuration, its table's state, its
tasks); a full collection then took 1.0-1.4 s (measured), and a commit landing meanwhile
waited as long.

So once every stream is past its start-up (none starting, waiting to start, or reading its
snapshot), :class:`HeapSettler` collects once and freezes what is left (:func:`gc.freeze`:
moved to a permanent generation that collections skip; objects are still freed when their
last reference goes). When a stream restarts or stops, the objects of its previous run may
have become garbage, cycles included, which a frozen heap would keep: the heap is unfrozen
then, and frozen again once the streams are past start-up again. What is frozen is at most
the heap as it was when frozen, so a cycle that dies while frozen is kept no longer than
the next restart.

Freezing concerns the whole process, so the daemon's command line (``serve``, ``tail``)
turns it on; an application running a service inside its own process keeps its heap as it
likes it.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Mapping

import anyio

from deltastream.daemon.observability.metrics import TableMetrics

__all__ = ["HeapSettler"]

log = logging.getLogger("deltastream.daemon")

#: The states of a stream still building what it will hold while it follows its table.
_SETTLING_STATES = frozenset({"starting", "snapshot"})


class HeapSettler:
    """Freezes the heap while every stream in ``metrics`` is past its start-up."""

    def __init__(self, metrics: Mapping[str, TableMetrics]) -> None:
        self._metrics = metrics
        self.frozen = False

    def settled(self) -> bool:
        """Whether every stream is past its start-up."""
        return not any(
            m.waiting_to_start or m.status in _SETTLING_STATES for m in self._metrics.values()
        )

    def check(self) -> None:
        """Freeze the heap if it is not frozen and every stream is past its start-up."""
        if self.frozen or not self.settled():
            return
        # One full collection first, so that no garbage is frozen.
        gc.collect()
        gc.freeze()
        self.frozen = True
        log.info(
            "every stream is past its start-up: %d objects frozen out of garbage collection",
            gc.get_freeze_count(),
        )

    def unsettle(self) -> None:
        """A stream restarts or stops: what it held may be garbage now."""
        if self.frozen:
            gc.unfreeze()
            self.frozen = False

    async def run(self, interval: float = 1.0) -> None:
        """:meth:`check` every ``interval`` seconds until cancelled; unfreeze at the end."""
        try:
            while True:
                self.check()
                await anyio.sleep(interval)
        finally:
            self.unsettle()
