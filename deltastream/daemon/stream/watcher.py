"""Watching one table's ``_delta_log`` for new versions, cheaply.

A poll is one LIST of ``_delta_log/`` starting at the next expected version: when nothing
changed it returns only ``_last_checkpoint`` (or nothing), and no object is read. Between
polls the watcher sleeps until its next poll time (:mod:`~deltastream.daemon.stream.poll_schedule`:
once per interval, the tables of a process spread evenly over it), or less when the store's
change feed (filesystem notifications, an SQS queue) says something arrived.

How long the interval is depends on the feed. With a feed the watcher trusts, the feed says
when to list and listing is the safety net: every ``safety_poll_interval`` (60 s by
default). Without a feed, or while the feed is not trusted, every ``poll_interval``. The
feed loses the watcher's trust when it *lapses*:

* it says it lost events (an inotify queue overflow): every table it watches lists at once;
* it fails (its directory was removed or replaced, the watch was dropped, the SQS queue's
  receives failed through their retries): the watcher lists at once and opens a new feed;
* a listing the timer made finds a version the feed never announced, written more than
  :data:`ANNOUNCE_GRACE_SECONDS` before (a queue that went quiet; the grace leaves room for
  a notification still on its way).

Trust comes back once the feed has gone ``safety_poll_interval`` without a lapse. A lapse is
logged once (at WARNING) while the feed is trusted, its return at INFO, and each is counted
(:attr:`PollStats.lapses`). No version waits for a notification that never comes longer than
a safety interval, and after a lapse no longer than a poll interval.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

import anyio

from deltastream.daemon.stream.poll_schedule import SLOTS, PollSlot, PollSlots
from deltastream.errors import StorageError
from deltastream.log.listing import list_log
from deltastream.log.paths import LOG_DIR, LogFile
from deltastream.log.segment import LogListing
from deltastream.storage.base import AsyncClosable, ChangeFeed, ObjectStore

__all__ = [
    "ANNOUNCE_GRACE_SECONDS",
    "DEFAULT_SAFETY_POLL_INTERVAL",
    "LogWatcher",
    "PollStats",
]

log = logging.getLogger(__name__)

#: Seconds between listings of a table whose change feed is trusted (the setting's default).
DEFAULT_SAFETY_POLL_INTERVAL = 60.0
#: A version a timer's listing finds is held against the feed only if its commit file is at
#: least this old: an SQS notification takes a second or so to arrive, and a commit may land
#: just before a listing that was due anyway.
ANNOUNCE_GRACE_SECONDS = 10.0


@dataclass
class PollStats:
    polls: int = 0
    wakeups: int = 0
    last_poll_seconds: float = 0.0
    total_poll_seconds: float = 0.0
    #: Times the change feed lapsed (lost events, failed, or missed a version).
    lapses: int = 0


class LogWatcher(AsyncClosable):
    """Finds log files of versions at or after a given one, waiting until there are some."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        poll_interval: float = 1.0,
        safety_poll_interval: float = DEFAULT_SAFETY_POLL_INTERVAL,
        jitter: float = 0.1,
        notifications: bool = True,
        slots: PollSlots = SLOTS,
        name: str | None = None,
        announce_grace: float = ANNOUNCE_GRACE_SECONDS,
    ) -> None:
        if poll_interval <= 0:
            raise ValueError(f"poll interval must be > 0, not {poll_interval}")
        if safety_poll_interval <= 0:
            raise ValueError(f"safety poll interval must be > 0, not {safety_poll_interval}")
        self.store = store
        self.poll_interval = poll_interval
        # Never less often than without a feed.
        self.safety_poll_interval = max(safety_poll_interval, poll_interval)
        self.jitter = jitter
        self.announce_grace = announce_grace
        self.stats = PollStats()
        #: Names the stream in log lines (the store's root by default).
        self.name = name or store.root_uri
        self._use_feed = notifications
        self._feed: ChangeFeed | None = None
        self._slots = slots
        self._slot: PollSlot | None = None
        #: Monotonic time from which the feed is trusted (its last lapse + a safety interval).
        self._trusted_from = 0.0
        #: Whether the last thing logged of the feed is that it is trusted (each change of
        #: trust is logged once).
        self._announced_trust = True
        #: Whether the last sleep ended on the timer (not woken by the feed), and whether the
        #: listing after it is to be checked for versions the feed never announced.
        self._timer_ended = False
        self._check_arrivals = False
        #: Monotonic time of the feed's latest failure.
        self._last_failure = -float("inf")

    @property
    def trusted(self) -> bool:
        """Whether a change feed is open and trusted: listings are only a safety net."""
        return self._feed is not None and time.monotonic() >= self._trusted_from

    @property
    def interval(self) -> float:
        """Seconds between this watcher's listings as things stand."""
        return self.safety_poll_interval if self.trusted else self.poll_interval

    async def poll(self, next_version: int) -> LogListing:
        """One LIST: the log files of versions ``>= next_version``."""
        # The feed is opened before listing, so that nothing arriving after the LIST is missed.
        await self._get_feed()
        # Only the first listing after a sleep the timer ended may hold the feed to account
        # (a listing right after a delivery may find versions whose wake-up is still pending).
        self._check_arrivals, self._timer_ended = self._timer_ended, False
        started = time.perf_counter()
        try:
            return await list_log(self.store, next_version)
        finally:
            elapsed = time.perf_counter() - started
            self.stats.polls += 1
            self.stats.last_poll_seconds = elapsed
            self.stats.total_poll_seconds += elapsed

    def arrived(self, commits: Iterable[LogFile]) -> None:
        """Tell the watcher what a listing found: the commits of versions not yet delivered
        (none, often). If the feed should have announced one of them and did not, it
        lapses."""
        check, self._check_arrivals = self._check_arrivals, False
        if not check or not self.trusted:
            return  # woken by the feed (it did announce), or listing at poll_interval anyway
        now_ms = time.time() * 1000
        grace_ms = self.announce_grace * 1000
        for f in commits:
            if f.last_modified_ms <= now_ms - grace_ms:
                self._lapse(f"a listing found version {f.version}, which it never announced")
                return

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
        self._timer_ended = False
        self._regain_trust()
        feed = await self._get_feed()
        delay = self._slot.next_poll(self.interval, self.jitter)
        if feed is None:
            await anyio.sleep(delay)
            self._timer_ended = True
            return
        failure: StorageError | None = None
        with anyio.move_on_after(delay) as timer:
            try:
                await feed.wait()
                self.stats.wakeups += 1
            except StorageError as e:
                failure = e
        if failure is not None:
            # Listed at once, and a new feed opened for the next poll; but failures come at
            # least a poll interval apart (a feed that fails as soon as it is opened must
            # not make the watcher list without pause).
            self._lapse(str(failure))
            await self._drop_feed()
            since = time.monotonic() - self._last_failure
            await anyio.sleep(max(0.0, self.poll_interval - since))
            self._last_failure = time.monotonic()
            return
        if timer.cancelled_caught:
            self._timer_ended = True
            return
        lapse = feed.take_lapse()
        if lapse is not None:
            self._lapse(lapse)

    def _lapse(self, reason: str) -> None:
        """The feed lost events or failed: distrust it for a safety interval (listing every
        poll interval meanwhile)."""
        self.stats.lapses += 1
        self._trusted_from = time.monotonic() + self.safety_poll_interval
        if self._announced_trust:
            self._announced_trust = False
            log.warning(
                "%s: the change feed lapsed (%s); listing the log every %ss until it has "
                "gone %ss without a lapse",
                self.name,
                reason,
                self.poll_interval,
                self.safety_poll_interval,
                extra={"stream": self.name},
            )

    def _regain_trust(self) -> None:
        if not self._announced_trust and self.trusted:
            self._announced_trust = True
            log.info(
                "%s: the change feed is trusted again; listing the log every %ss",
                self.name,
                self.safety_poll_interval,
                extra={"stream": self.name},
            )

    async def _get_feed(self) -> ChangeFeed | None:
        # A store may have no feed yet (a local table whose _delta_log does not exist), so
        # asking again is cheap and expected; a store that cannot open one is not asked again.
        if self._use_feed and self._feed is None:
            try:
                self._feed = await self.store.watch(LOG_DIR)
            except StorageError as e:
                log.warning(
                    "%s: %s; listing the log every %ss instead",
                    self.name,
                    e,
                    self.poll_interval,
                    extra={"stream": self.name},
                )
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
