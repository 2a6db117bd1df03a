"""The one retry policy of deltastream's network clients, and how a retry is reported.

The object stores (S3, Azure, GCS) and the daemon's HTTP, exec and Delta sinks retry through
:func:`call_with_retries`, the one retry loop; it and the daemon's supervisor (restarting a
stream after a transient error, see :func:`deltastream.errors.is_transient`) wait with the
same backoff, :func:`backoff_delay`: exponential with full jitter (or, for the HTTP sink,
the ``Retry-After`` its server asked for). Before sleeping, each retry of a request is
described by a :class:`RetryEvent` and handed to the client's :data:`RetryListener` if one
is set (the daemon counts retries and logs them with the stream's name); without a listener
the client logs the retry itself at WARNING. Either way a retry is never silent, and is
reported once.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import anyio

from deltastream.errors import StorageError

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_RETRY_BASE_DELAY",
    "DEFAULT_RETRY_MAX_DELAY",
    "RetryEvent",
    "RetryListener",
    "RetryPolicy",
    "backoff_delay",
    "call_with_retries",
]

T = TypeVar("T")
_log = logging.getLogger("deltastream.storage")

#: Keeps ``2.0**exponent`` finite however many attempts a client makes (it may retry forever).
_MAX_EXPONENT = 62


def backoff_delay(attempt: int, base: float, cap: float) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1 for the first): full jitter,
    ``uniform(0, min(cap, base * 2**(attempt - 1)))``.

    Full jitter spreads the retries of many clients that failed together (a throttled
    bucket, a restarted receiver) instead of having them come back in waves.
    """
    exponent = min(max(attempt - 1, 0), _MAX_EXPONENT)
    return random.uniform(0, min(cap, base * 2.0**exponent))


@dataclass(frozen=True, slots=True)
class RetryEvent:
    """One failed attempt that is about to be retried."""

    #: What failed: an S3 request (``GET``, ``PUT``, ``LIST``, ``HEAD``, ``DELETE``, or an SQS
    #: action), a sink's ``POST``, or ``exec`` (a command run by the exec sink).
    operation: str
    #: What it was aimed at: an object's URI, a URL, a command.
    target: str
    #: The attempt that failed (1 for the first): the retry about to be made is retry number
    #: ``attempt``.
    attempt: int
    #: Why it failed, in one line (``SlowDown``, ``ClientConnectorError: …``, ``HTTP 503``).
    cause: str
    #: Seconds until the retry.
    delay: float


#: Called for every retry, before the client sleeps; it must not block or raise.
RetryListener = Callable[[RetryEvent], None]


#: The store clients' defaults (storage options ``max_attempts``, ``retry_base_delay``,
#: ``retry_max_delay``), shared by every store so that they cannot drift apart.
DEFAULT_MAX_ATTEMPTS = 10
DEFAULT_RETRY_BASE_DELAY = 0.1
DEFAULT_RETRY_MAX_DELAY = 5.0


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently a store retries one request."""

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    #: Retry ``n`` waits ``uniform(0, min(max_delay, base_delay * 2**(n - 1)))`` seconds.
    base_delay: float = DEFAULT_RETRY_BASE_DELAY
    max_delay: float = DEFAULT_RETRY_MAX_DELAY


async def call_with_retries(
    op: Callable[[], Awaitable[T]],
    *,
    operation: str,
    target: str,
    policy: RetryPolicy,
    transient: Callable[[BaseException], str | None],
    listener: RetryListener | None,
    on_retry: Callable[[], None] | None = None,
    logger: logging.Logger | None = None,
    requested_delay: Callable[[BaseException], float | None] | None = None,
    give_up: Callable[[BaseException, int, str], BaseException] | None = None,
) -> T:
    """Run ``op()`` until it succeeds, retrying what ``transient`` calls transient.

    ``transient(error)`` returns a one-line cause (``503 ServerBusy``, ``ClientOSError: …``)
    for an error worth retrying, None for any other, which propagates at once, unchanged
    (stores turn their clients' errors into :mod:`deltastream.errors` exceptions before or
    after this loop). After ``policy.max_attempts`` failed attempts the last transient error
    becomes ``give_up(error, attempts, cause)``, by default a
    :class:`~deltastream.errors.StorageError` naming ``target``, the operation, the number
    of attempts and the cause; it is raised from the error. Each wait is the backoff's, or
    the one the error asks for if ``requested_delay`` returns one (an HTTP ``Retry-After``).
    Before each wait, the retry is counted (``on_retry``) and reported to ``listener``, or
    logged at WARNING on ``logger`` without one.
    """
    attempt = 0
    while True:
        attempt += 1
        try:
            return await op()
        except Exception as e:
            cause = transient(e)
            if cause is None:
                raise
            if attempt >= policy.max_attempts:
                if give_up is not None:
                    raise give_up(e, attempt, cause) from e
                raise StorageError(
                    target, f"{operation} failed after {attempt} attempt(s): {cause}"
                ) from e
            asked = None if requested_delay is None else requested_delay(e)
        delay = (
            backoff_delay(attempt, policy.base_delay, policy.max_delay) if asked is None else asked
        )
        if on_retry is not None:
            on_retry()
        event = RetryEvent(operation, target, attempt, cause, delay)
        if listener is not None:
            listener(event)
        else:
            (logger or _log).warning(
                "%s %s failed (%s); retry %d in %.2fs", operation, target, cause, attempt, delay
            )
        await anyio.sleep(delay)
