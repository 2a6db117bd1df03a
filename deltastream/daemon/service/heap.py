"""Short garbage-collector pauses for a daemon holding thousands of streams.

CPython's full collections walk every object the collector tracks, and they stop the event
loop while they do. A daemon following 10,000 tables holds about 1.2 GiB of such objects,
nearly all of them living as long as their stream (its configuration, its table's state, its
tasks); a full collection then took 1.0-1.4 s (measured), and a commit landing meanwhile
waited as long.

So once every stream is past its start-up (none starting, waiting to start, or reading its
snapshot), :class:`HeapSettler` collects once and freezes what is left (:func:`gc.freeze`:
moved to a permanent generation that collections skip; objects are still freed when their
last reference goes). Only a reference cycle that dies while frozen waits: for the hourly
full collection below. A stream that restarts later does not unfreeze the heap (at 10,000
tables that would stall every stream for a full collection at each restart): the objects of
its new run are frozen with the next survivors.

A frozen heap still needs two chores, which :meth:`HeapSettler.run` does:

* **Young collections, every second.** CPython counts allocations minus deallocations of
  *any* tracked object to decide when to collect the young generation, so a daemon that
  frees old (frozen) objects as fast as it makes new ones (every poll replaces a stream's
  listing and tasks) collects rarely, and then over a young generation of 100,000 objects
  or more: 50-240 ms stalls every half minute at 10,000 tables. Collected every second it is
  a few thousand objects, about a millisecond.
* **Refreezing.** What survives goes on to the old generation, which would grow back to the
  whole heap as the streams' objects turn over: every minute the survivors are frozen too,
  and every hour the heap is unfrozen, fully collected (the cycles that died while frozen)
  and frozen again.

Freezing concerns the whole process, so the daemon's command line (``serve``, ``tail``)
turns it on; an application running a service inside its own process keeps its heap as it
likes it.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Mapping

import anyio

from deltastream.daemon.observability.metrics import TableMetrics

__all__ = ["HeapSettler"]

log = logging.getLogger("deltastream.daemon")

#: Seconds between the frozen heap's young collections.
YOUNG_COLLECTION_INTERVAL = 1.0
#: Seconds between freezing what survived since the last freeze.
REFREEZE_INTERVAL = 60.0
#: Seconds between full collections of an unfrozen heap (frozen again after).
FULL_COLLECTION_INTERVAL = 3600.0

#: The states of a stream still building what it will hold while it follows its table.
_SETTLING_STATES = frozenset({"starting", "snapshot"})


class HeapSettler:
    """Freezes the heap while every stream in ``metrics`` is past its start-up."""

    def __init__(self, metrics: Mapping[str, TableMetrics]) -> None:
        self._metrics = metrics
        self.frozen = False
        self._frozen_at = self._collected_at = 0.0

    def settled(self) -> bool:
        """Whether every stream is past its start-up."""
        return not any(
            m.waiting_to_start or m.status in _SETTLING_STATES for m in self._metrics.values()
        )

    def check(self) -> None:
        """Freeze the heap if it is not frozen and every stream is past its start-up."""
        if self.frozen or not self.settled():
            return
        self._collect_and_freeze()
        self.frozen = True
        log.info(
            "every stream is past its start-up: %d objects frozen out of garbage collection",
            gc.get_freeze_count(),
        )

    def _collect_and_freeze(self) -> None:
        # One full collection first, so that no garbage is frozen.
        gc.collect()
        gc.freeze()
        self._frozen_at = self._collected_at = time.monotonic()

    def tend(self) -> None:
        """The frozen heap's chores (see the module docstring): a young collection, and when
        due, freezing the survivors or a full collection."""
        if not self.frozen:
            return
        now = time.monotonic()
        if now - self._collected_at >= FULL_COLLECTION_INTERVAL:
            gc.unfreeze()
            self._collect_and_freeze()
            return
        gc.collect(0)
        if now - self._frozen_at >= REFREEZE_INTERVAL:
            gc.freeze()
            self._frozen_at = now

    def unsettle(self) -> None:
        """Unfreeze the heap (the service ends)."""
        if self.frozen:
            gc.unfreeze()
            self.frozen = False

    async def run(self) -> None:
        """:meth:`check` and :meth:`tend` every second until cancelled; unfreeze at the
        end."""
        try:
            while True:
                self.check()
                self.tend()
                await anyio.sleep(YOUNG_COLLECTION_INTERVAL)
        finally:
            self.unsettle()
