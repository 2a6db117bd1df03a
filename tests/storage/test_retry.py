"""The retry policy shared by the S3 store and the daemon's sinks: full-jitter exponential
backoff that stays finite however long a client retries."""

from __future__ import annotations

import math

import pytest

from deltastream.storage.retry import RetryEvent, backoff_delay


@pytest.mark.parametrize(
    ("attempt", "ceiling"),
    [(1, 0.1), (2, 0.2), (3, 0.4), (6, 3.2), (7, 5.0), (50, 5.0)],
)
def test_backoff_is_full_jitter_below_a_doubling_capped_ceiling(
    attempt: int, ceiling: float
) -> None:
    delays = [backoff_delay(attempt, 0.1, 5.0) for _ in range(2000)]
    assert all(0 <= d <= ceiling for d in delays)
    # Spread over the whole range (full jitter), not bunched near the ceiling.
    assert min(delays) < ceiling * 0.1
    assert max(delays) > ceiling * 0.9


def test_backoff_stays_finite_when_retrying_forever() -> None:
    for attempt in (64, 1_000, 10**9):
        delay = backoff_delay(attempt, 0.5, math.inf)
        assert math.isfinite(delay) and delay >= 0
    assert backoff_delay(0, 1.0, 60.0) <= 1.0  # nonsense attempts get the first delay
    assert backoff_delay(5, 0.0, 60.0) == 0.0


def test_retry_event_is_a_frozen_value() -> None:
    event = RetryEvent("GET", "s3://b/k", 2, "503 SlowDown", 0.25)
    assert event == RetryEvent("GET", "s3://b/k", 2, "503 SlowDown", 0.25)
    with pytest.raises(AttributeError):
        event.attempt = 3  # type: ignore[misc]
