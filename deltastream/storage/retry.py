"""The one retry policy of deltastream's network clients, and how a retry is reported.

The S3 store (:mod:`deltastream.storage.s3`), the daemon's HTTP and exec sinks, and the
daemon's supervisor (restarting a stream after a transient error, see
:func:`deltastream.errors.is_transient`) wait with the same backoff, :func:`backoff_delay`:
exponential with full jitter. Before sleeping, each retry of a request is described by a
:class:`RetryEvent` and handed to the client's :data:`RetryListener` if one is set (the
daemon counts retries and logs them with the stream's name); without a listener the client
logs the retry itself at WARNING. Either way a retry is never silent, and is reported once.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["RetryEvent", "RetryListener", "backoff_delay"]

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
