"""The retry policy shared by the S3 store and the daemon's sinks: full-jitter exponential
backoff that stays finite however long a client retries."""

from __future__ import annotations

import math

import anyio
import pytest

from deltastream.errors import SinkError
from deltastream.storage.retry import RetryEvent, RetryPolicy, backoff_delay, call_with_retries


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


def test_a_requested_delay_replaces_the_backoff_and_give_up_names_the_error() -> None:
    """What the HTTP sink needs of the shared loop: a ``Retry-After`` instead of the backoff,
    and its own error when the attempts run out (raised from the last failure)."""
    events: list[RetryEvent] = []
    slept: list[float] = []

    class Busy(Exception):
        pass

    async def op() -> None:
        raise Busy("busy")

    async def run() -> None:
        await call_with_retries(
            op,
            operation="POST",
            target="http://x",
            policy=RetryPolicy(3, 100.0, 100.0),  # a backoff no test would wait for
            transient=lambda e: "HTTP 503" if isinstance(e, Busy) else None,
            listener=events.append,
            requested_delay=lambda e: 0.01,
            give_up=lambda e, attempts, cause: SinkError("http://x", f"{attempts}: {cause}"),
        )

    real_sleep = anyio.sleep

    async def sleep(delay: float) -> None:
        slept.append(delay)
        await real_sleep(0)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(anyio, "sleep", sleep)
        with pytest.raises(SinkError, match="3: HTTP 503") as e:
            anyio.run(run)
    assert isinstance(e.value.__cause__, Busy)
    assert slept == [0.01, 0.01]
    assert [(ev.attempt, ev.delay, ev.cause) for ev in events] == [
        (1, 0.01, "HTTP 503"),
        (2, 0.01, "HTTP 503"),
    ]
