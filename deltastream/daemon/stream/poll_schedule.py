"""When each followed table is polled: at fixed times, spread evenly over the poll interval.

Tables followed by one process start together; polled "every interval, give or take some
random jitter" they would stay bunched for a long time, and a thousand tables on S3 would
send a thousand LISTs within a fraction of a second, every second. Instead each watcher
holds a *slot*: a phase in [0, 1) taken from a low-discrepancy sequence (0, 1/2, 1/4, 3/4,
1/8, 5/8, ...), so that however many tables there are their phases are about evenly spaced,
and slots freed by tables that stop are reused first. A watcher polls when the monotonic
clock reaches its phase of an interval (``(k + phase) * interval``), so polls stay spread
whatever each poll costs. The process adds one random offset to every phase, so that two
processes on one machine do not poll in step.

Jitter moves each poll by up to ± ``jitter`` of the gap between neighbouring slots (the
whole interval when one table is followed): a little randomness that cannot bunch polls.
"""

from __future__ import annotations

import heapq
import random
import threading
import time
from dataclasses import dataclass, field

__all__ = ["SLOTS", "PollSlot", "PollSlots", "slot_phase"]


def slot_phase(index: int) -> float:
    """The ``index``-th term of the base-2 van der Corput sequence: 0, 1/2, 1/4, 3/4, 1/8…
    Any prefix of it is spread over [0, 1) with gaps that differ by at most a factor of 2."""
    phase, denominator = 0.0, 1.0
    while index:
        denominator *= 2
        index, bit = divmod(index, 2)
        phase += bit / denominator
    return phase


@dataclass(eq=False)
class PollSlot:
    """One watcher's place in the schedule; :meth:`release` it when the watcher stops."""

    slots: PollSlots
    index: int
    released: bool = field(default=False)

    @property
    def phase(self) -> float:
        return (self.slots.offset + slot_phase(self.index)) % 1.0

    def next_poll(self, interval: float, jitter: float, now: float | None = None) -> float:
        """Seconds until this slot's next poll time after ``now`` (the monotonic clock)."""
        now = time.monotonic() if now is None else now
        gap = interval / max(1, self.slots.in_use)
        shift = random.uniform(-jitter, jitter) * gap if jitter else 0.0
        # The next grid point (k + phase) * interval after now, moved by the jitter; never
        # less than a tenth of a gap away, so a poll that ran late does not poll again at once.
        k = (now - self.phase * interval) // interval + 1
        at = (k + self.phase) * interval + shift
        while at - now < gap / 10:
            at += interval
        return at - now

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.slots.release(self.index)


class PollSlots:
    """The slots of one process (thread-safe: watchers may run on several event loops)."""

    def __init__(self, offset: float | None = None) -> None:
        self.offset = random.random() if offset is None else offset
        self._lock = threading.Lock()
        self._free: list[int] = []
        self._next = 0

    @property
    def in_use(self) -> int:
        with self._lock:
            return self._next - len(self._free)

    def take(self) -> PollSlot:
        """The lowest free slot (so the phases in use stay evenly spread)."""
        with self._lock:
            if self._free:
                index = heapq.heappop(self._free)
            else:
                index, self._next = self._next, self._next + 1
        return PollSlot(self, index)

    def release(self, index: int) -> None:
        with self._lock:
            heapq.heappush(self._free, index)
            # Trailing free slots shrink the sequence, so that in_use counts live slots only.
            while self._free and self._next - 1 in self._free:
                self._free.remove(self._next - 1)
                heapq.heapify(self._free)
                self._next -= 1


#: The process's schedule, shared by every watcher.
SLOTS = PollSlots()
