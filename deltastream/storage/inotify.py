"""Local change feeds on Linux: one inotify instance per event loop, shared by every feed.

A feed per table with its own watcher thread stepping every few milliseconds costs each
table a thread and a wake-up a hundred times a second, and Linux lets a user open only 128
inotify instances by default: a process following a thousand tables cannot work that way.
Here every feed of an event loop is a watch on one inotify file descriptor, which the event
loop reads when the kernel says there is something to read (``add_reader``): no thread, no
timer, no work at all while nothing changes.

A feed wakes for files created in, renamed into, or closed after writing in its directory
(not subdirectories, not deletions), a few milliseconds after the first such event so that a
burst of them (a create, then the write that closes it) wakes it once. Removing or renaming
the directory fails its feeds (inotify would then watch nothing there, even if the directory
is created again). If the kernel's event queue overflows, every feed lapses (wakes, and says
so to :meth:`~deltastream.storage.base.ChangeFeed.take_lapse`): a feed may wake for nothing,
never sleep through a change it saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import weakref
from collections.abc import Callable
from pathlib import Path

from inotify_simple import INotify, flags  # type: ignore[import-untyped]

from deltastream.errors import StorageError
from deltastream.storage.base import SignalledChangeFeed

__all__ = ["SharedInotify", "inotify_feed"]

#: Events that may mean a new file is there to be listed.
_WAKE = flags.CREATE | flags.MOVED_TO | flags.CLOSE_WRITE
#: The directory itself went away (or moved): its watch is useless from now on.
_GONE = flags.DELETE_SELF | flags.MOVE_SELF
_MASK = _WAKE | _GONE | flags.ONLYDIR
#: Seconds from the first event of a burst until its feeds wake.
DEBOUNCE_SECONDS = 0.005


class InotifyFeed(SignalledChangeFeed):
    """A change feed for one directory, fed by its event loop's :class:`SharedInotify`."""

    def __init__(self, uri: str, hub: SharedInotify, wd: int) -> None:
        super().__init__(uri)
        self._hub, self._wd = hub, wd
        #: Called once when the feed closes (its store forgets it).
        self.on_close: Callable[[InotifyFeed], object] | None = None

    async def aclose(self) -> None:
        if not self.closed:
            self._hub.remove(self, self._wd)
            if self.on_close is not None:
                self.on_close(self)
        await super().aclose()


class SharedInotify:
    """The inotify instance of one event loop and the feeds watching through it; the file
    descriptor is opened with the first feed and closed with the last."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._inotify = INotify(nonblocking=True)
        self._feeds: dict[int, set[InotifyFeed]] = {}
        self._due: set[InotifyFeed] = set()
        self._flush_handle: asyncio.TimerHandle | None = None
        loop.add_reader(self._inotify.fileno(), self._on_readable)

    @property
    def watches(self) -> int:
        """Directories watched (for tests and metrics)."""
        return len(self._feeds)

    def add(self, path: Path, uri: str) -> InotifyFeed | None:
        """A feed for directory ``path`` (``uri`` names it in errors), or None if it is not a
        directory. Directories watched by several feeds are one inotify watch."""
        try:
            wd = self._inotify.add_watch(os.fspath(path), _MASK)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            if e.errno == errno.ENOTDIR:
                return None
            # ENOSPC: fs.inotify.max_user_watches reached; EACCES: not readable.
            raise StorageError(uri, f"cannot watch for changes: {e}") from e
        feed = InotifyFeed(uri, self, wd)
        self._feeds.setdefault(wd, set()).add(feed)
        return feed

    def remove(self, feed: InotifyFeed, wd: int) -> None:
        self._due.discard(feed)
        feeds = self._feeds.get(wd)
        if feeds is None:
            return
        feeds.discard(feed)
        if not feeds:
            del self._feeds[wd]
            # The kernel may have dropped the watch already (its directory is gone).
            with contextlib.suppress(OSError):
                self._inotify.rm_watch(wd)
        if not self._feeds:
            self._close()

    def _close(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if _hubs.get(self._loop) is self:
            del _hubs[self._loop]
        if not self._inotify.closed:
            self._loop.remove_reader(self._inotify.fileno())
            self._inotify.close()

    def _on_readable(self) -> None:
        try:
            events = self._inotify.read(timeout=0)
        except BlockingIOError:
            return
        except OSError as e:
            self._fail_all(f"watching for changes failed: {e}", e)
            return
        for event in events:
            if event.mask & flags.Q_OVERFLOW:
                # Events were lost: every feed lapses (it wakes, and its watcher lists and
                # distrusts it for a while) rather than miss a commit.
                for feeds in self._feeds.values():
                    for feed in feeds:
                        feed._lapse("the inotify event queue overflowed: events were lost")
                continue
            watching = self._feeds.get(event.wd)
            if not watching:
                continue  # a watch removed since the event was queued
            if event.mask & (_GONE | flags.IGNORED):
                self._gone(event.wd)
            elif event.mask & _WAKE and not event.mask & flags.ISDIR:
                self._due.update(watching)
        if self._due and self._flush_handle is None:
            self._flush_handle = self._loop.call_later(DEBOUNCE_SECONDS, self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        due, self._due = self._due, set()
        for feed in due:
            feed._signal()

    def _gone(self, wd: int) -> None:
        for feed in self._feeds.pop(wd, set()):
            self._due.discard(feed)
            feed._fail("the directory was removed or renamed")
        with contextlib.suppress(OSError):  # moved, not removed: the kernel keeps the watch
            self._inotify.rm_watch(wd)
        if not self._feeds:
            self._close()

    def _fail_all(self, problem: str, cause: BaseException) -> None:
        for feeds in self._feeds.values():
            for feed in feeds:
                feed._fail(problem, cause)
        self._feeds.clear()
        self._close()


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SharedInotify] = (
    weakref.WeakKeyDictionary()
)


def inotify_feed(path: Path, uri: str) -> InotifyFeed | None:
    """A feed for the directory ``path`` through the running event loop's shared inotify
    instance (created on first use), or None if ``path`` is no directory. Call on the loop."""
    loop = asyncio.get_running_loop()
    hub = _hubs.get(loop)
    if hub is None:
        try:
            hub = SharedInotify(loop)
        except OSError as e:  # EMFILE: fs.inotify.max_user_instances reached
            raise StorageError(uri, f"cannot watch for changes: {e}") from e
        _hubs[loop] = hub
    feed = hub.add(path, uri)
    if feed is None and not hub.watches:
        hub._close()
    return feed
