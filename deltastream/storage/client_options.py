"""Storage options every object store takes, their defaults, and how option values parse.

Each store's options class (:class:`~deltastream.storage.s3.S3Options`, the Azure and GCS
ones) accepts :data:`COMMON_OPTION_NAMES` (retries, timeouts, concurrency) with the defaults
here, and parses its values with :func:`parse_common`, :func:`parse_bool` and
:func:`parse_number`, so that a setting means the same on every store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from deltastream.errors import InvalidArgumentError
from deltastream.storage.retry import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRY_BASE_DELAY,
    DEFAULT_RETRY_MAX_DELAY,
    RetryPolicy,
)

__all__ = [
    "COMMON_OPTION_NAMES",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_CONCURRENCY",
    "DEFAULT_READ_TIMEOUT",
    "DEFAULT_RETRY_BASE_DELAY",
    "DEFAULT_RETRY_MAX_DELAY",
    "ClientOptions",
    "parse_bool",
    "parse_common",
    "parse_number",
    "unknown_option",
]

T = TypeVar("T")

#: Seconds to wait for a connection, and for each read of an answer.
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_READ_TIMEOUT = 60.0
#: Requests a store has in flight at most (:attr:`ObjectStore.max_concurrency`).
DEFAULT_MAX_CONCURRENCY = 32

_INTEGERS = ("max_attempts", "max_concurrency")
_SECONDS = ("retry_base_delay", "retry_max_delay", "connect_timeout", "read_timeout")

#: The option names every store accepts; each is also the name of its options field.
COMMON_OPTION_NAMES: frozenset[str] = frozenset(_INTEGERS + _SECONDS)


@dataclass(frozen=True)
class ClientOptions:
    """The settings every store's options class has (it subclasses this one): retries,
    timeouts, concurrency, each a storage option of the same name."""

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    #: Retry ``n`` waits ``uniform(0, min(retry_max_delay, retry_base_delay * 2**(n - 1)))``
    #: seconds (:func:`~deltastream.storage.retry.backoff_delay`).
    retry_base_delay: float = DEFAULT_RETRY_BASE_DELAY
    retry_max_delay: float = DEFAULT_RETRY_MAX_DELAY
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY

    @property
    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(self.max_attempts, self.retry_base_delay, self.retry_max_delay)


def parse_common(name: str, value: str) -> int | float:
    """The value of common option ``name`` (lower case, one of :data:`COMMON_OPTION_NAMES`):
    integers at least 1, non-negative seconds."""
    if name in _INTEGERS:
        number: int | float = parse_number(name, value, int)
        if number < 1:
            raise InvalidArgumentError(f"storage option {name!r} must be >= 1")
        return number
    if name not in _SECONDS:
        raise InvalidArgumentError(f"{name!r} is not a storage option every store takes")
    number = parse_number(name, value, float)
    if not number >= 0:  # also refuses NaN
        raise InvalidArgumentError(f"storage option {name!r} must be a number of seconds >= 0")
    return number


def parse_number(name: str, value: str, kind: Callable[[str], T]) -> T:
    """``kind(value)``, or an error naming the option ``name``."""
    try:
        return kind(value)
    except ValueError as e:
        raise InvalidArgumentError(f"storage option {name!r}: {value!r} is not a number") from e


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def parse_bool(
    name: str, value: str, *, default: bool = False, what: str = "storage option"
) -> bool:
    """A flag's value: true/false, 1/0, yes/no, on/off (any case); empty: ``default`` (as if
    not set); anything else is an error, so that a typo is not read as false. The one rule
    for flags users write, in storage options and the Spark source's options (``what``
    names the kind of option in the error)."""
    v = value.strip().lower()
    if not v:
        return default
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise InvalidArgumentError(f"{what} {name!r}: {value!r} is not true or false")


def unknown_option(store: str, name: str, known: Iterable[str]) -> InvalidArgumentError:
    """The error for an option name ``store`` (``S3``, ``Azure``, ``GCS``) does not take."""
    listed = ", ".join(sorted(known))
    return InvalidArgumentError(f"unknown {store} storage option {name!r}; known options: {listed}")
