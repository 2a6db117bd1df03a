"""Watching one table's ``_delta_log`` for new versions, cheaply.

A poll is one LIST of ``_delta_log/`` starting at the next expected version: when nothing
changed it returns only ``_last_checkpoint`` (or nothing), and no object is read. Between
polls the watcher sleeps until its next poll time (:mod:`~deltastream.daemon.stream.poll_schedule`:
once per poll interval, the tables of a process spread evenly over it), or less when the
store's change feed (filesystem notifications, an SQS queue) says something arrived. The
feed only shortens the wait: polling stays the safety net for any event a feed misses.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import anyio

from deltastream.daemon.stream.poll_schedule import SLOTS, PollSlot, PollSlots
from deltastream.errors import StorageError
from deltastream.log.listing import list_log
from deltastream.log.paths import LOG_DIR
from deltastream.log.segment import LogListing
from deltastream.storage.base import AsyncClosable, ChangeFeed, ObjectStore

__all__ = ["LogWatcher", "PollStats"]

log = logging.getLogger(__name__)


@dataclass
class PollStats:
    polls: int = 0
    wakeups: int = 0
    last_poll_seconds: float = 0.0
    total_poll_seconds: float = 0.0


class LogWatcher(AsyncClosable):
    """Finds log files of versions at or after a given one, waiting until there are some."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        poll_interval: float = 1.0,
        jitter: float = 0.1,
        notifications: bool = True,
        slots: PollSlots = SLOTS,
    ) -> None:
        if poll_interval <= 0:
            raise ValueError(f"poll interval must be > 0, not {poll_interval}")
        self.store = store
        self.poll_interval = poll_interval
        self.jitter = jitter
        self.stats = PollStats()
        self._use_feed = notifications
        self._feed: ChangeFeed | None = None
        self._slots = slots
        self._slot: PollSlot | None = None

    async def poll(self, next_version: int) -> LogListing:
        """One LIST: the log files of versions ``>= next_version``."""
        # The feed is opened before listing, so that nothing arriving after the LIST is missed.
        await self._get_feed()
        started = time.perf_counter()
        try:
            return await list_log(self.store, next_version)
        finally:
            elapsed = time.perf_counter() - started
            self.stats.polls += 1
            self.stats.last_poll_seconds = elapsed
            self.stats.total_poll_seconds += elapsed

    async def wait(self, next_version: int) -> LogListing:
        """Poll until the log has a file of a version ``>= next_version``; return that listing."""
        while True:
            listing = await self.poll(next_version)
            if any(f.version >= next_version for f in listing.files):
                return listing
            await self.sleep()

    async def sleep(self) -> None:
        """Wait until this watcher's next poll time, or until the change feed wakes us."""
        if self._slot is None:
            self._slot = self._slots.take()
        delay = self._slot.next_poll(self.poll_interval, self.jitter)
        feed = await self._get_feed()
        if feed is None:
            await anyio.sleep(delay)
            return
        with anyio.move_on_after(delay):
            try:
                await feed.wait()
                self.stats.wakeups += 1
            except StorageError as e:
                log.warning("%s; falling back to polling every %ss", e, self.poll_interval)
                self._use_feed = False
                await self._drop_feed()
                await anyio.sleep(delay)

    async def _get_feed(self) -> ChangeFeed | None:
        # A store may have no feed yet (a local table whose _delta_log does not exist), so
        # asking again is cheap and expected; a feed that failed is not reopened.
        if self._use_feed and self._feed is None:
            try:
                self._feed = await self.store.watch(LOG_DIR)
            except StorageError as e:
                log.warning("%s; polling every %ss instead", e, self.poll_interval)
                self._use_feed = False
        return self._feed

    async def _drop_feed(self) -> None:
        feed, self._feed = self._feed, None
        if feed is not None:
            with anyio.CancelScope(shield=True):
                await feed.aclose()

    async def aclose(self) -> None:
        if self._slot is not None:
            self._slot.release()
            self._slot = None
        await self._drop_feed()
