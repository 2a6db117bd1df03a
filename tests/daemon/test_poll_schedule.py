"""The poll schedule: evenly spread phases, freed slots reused, fixed poll times."""

from __future__ import annotations

import itertools

import pytest

from deltastream.daemon.stream.poll_schedule import PollSlots, slot_phase


def test_phases_of_any_prefix_are_evenly_spread() -> None:
    assert [slot_phase(i) for i in range(8)] == [0, 0.5, 0.25, 0.75, 0.125, 0.625, 0.375, 0.875]
    for n in (3, 10, 100, 1_000):
        phases = sorted(slot_phase(i) for i in range(n))
        gaps = [b - a for a, b in zip(phases, [*phases[1:], 1.0], strict=True)]
        assert max(gaps) <= 2 / n + 1e-12 and min(gaps) >= 1 / (2 * n) - 1e-12, n


def test_freed_slots_are_reused_lowest_first() -> None:
    slots = PollSlots(offset=0.0)
    taken = [slots.take() for _ in range(5)]
    assert [s.index for s in taken] == [0, 1, 2, 3, 4] and slots.in_use == 5
    taken[3].release()
    taken[1].release()
    taken[1].release()  # releasing twice is harmless
    assert slots.in_use == 3
    assert [slots.take().index, slots.take().index, slots.take().index] == [1, 3, 5]
    for s in taken:
        s.release()


@pytest.mark.parametrize("tables", [1, 10, 1_000])
def test_polls_of_many_tables_are_spread_evenly_over_the_interval(tables: int) -> None:
    """Polls happen at each slot's phase of every interval: over any interval, each table
    polls once and the largest gap between two polls is at most twice the even spacing."""
    interval = 1.0
    slots = PollSlots(offset=0.37)
    held = [slots.take() for _ in range(tables)]
    now = 1_000.123
    times = sorted(now + s.next_poll(interval, jitter=0.0, now=now) for s in held)
    assert times[-1] - now <= interval + 1e-9
    gaps = [b - a for a, b in itertools.pairwise(times)]
    if gaps:
        assert max(gaps) <= 2 * interval / tables + 1e-9
    # The next poll of each is exactly one interval later, whatever the previous poll cost.
    for s in held[:10]:
        first = now + s.next_poll(interval, 0.0, now=now)
        later = first + 0.3  # the poll took 0.3 s
        assert later + s.next_poll(interval, 0.0, now=later) == pytest.approx(first + interval)
    # Jitter moves a poll by at most its fraction of the gap between slots.
    for s in held[:10]:
        base = s.next_poll(interval, 0.0, now=now)
        for _ in range(20):
            moved = s.next_poll(interval, 0.1, now=now)
            assert abs(moved - base) <= 0.1 * interval / tables + 1e-9 or moved > base + 0.5
