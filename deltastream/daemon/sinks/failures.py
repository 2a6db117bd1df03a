"""Which failures of a sink's target a retry can fix, and what the others become: the one
classification every transactional sink (Delta, PostgreSQL) retries by.

:func:`transient_cause` gives a one-line cause for a failure worth retrying (a concurrent
writer won a commit, the store or the server failed or went away, a serialization failure
or deadlock) and ``None`` for any other. Anything else is permanent: a constraint the rows
break (CHECK, NOT NULL), a table property that forbids the change (``delta.appendOnly``), a
missing privilege (PostgreSQL's 42501; a store's 401 or 403, which deltastream's stores raise
as :class:`~deltastream.errors.AccessDeniedError` and delta-rs reports as ``object_store``'s
permission errors; a local ``EACCES``), a type the target refuses, deltastream's own errors.
The sinks retry only
transient failures (:func:`~deltastream.storage.retry.call_with_retries`, the project's
backoff) and turn a permanent one into a :mod:`deltastream.errors` error at once
(:func:`permanent_error`): a :class:`~deltastream.errors.SinkRejectedError`, which stops the
stream (exit 2) instead of restarting it forever. Nothing of the failed delivery is
committed either way.

The drivers' exception types are imported only when an error of theirs is at hand (a
psycopg error means psycopg is loaded): neither extra is needed to classify the other's
errors.
"""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psycopg

from deltastream.errors import AccessDeniedError, DeltaStreamError, SinkRejectedError

__all__ = ["RetryableConflict", "permanent_error", "transient_cause"]


class RetryableConflict(Exception):
    """A sink's own signal that its commit lost to another writer's in a way its checks
    decide again on a retry (a table created meanwhile at a Delta target)."""


def transient_cause(error: BaseException) -> str | None:
    """A one-line cause for a failure worth retrying; ``None`` for a permanent one (see the
    module docstring)."""
    if isinstance(error, DeltaStreamError) or _denied(error):
        return None
    if isinstance(error, RetryableConflict):
        return _named(error)
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None and isinstance(error, psycopg.Error):
        return _postgresql_transient(error)
    deltalake = sys.modules.get("deltalake")
    if deltalake is not None and isinstance(error, deltalake.exceptions.DeltaError):
        return _delta_transient(error)
    if isinstance(error, OSError | TimeoutError):
        return f"{type(error).__name__}: {error}"
    return None


def permanent_error(description: str, error: Exception, what: str) -> DeltaStreamError:
    """The :mod:`deltastream.errors` error for a failure of ``what`` (a delivery, a claim)
    at the target ``description`` that retrying cannot fix."""
    if isinstance(error, AccessDeniedError) or _denied(error):
        return SinkRejectedError(
            description,
            f"{what}: {_one_line(error)} (the store refused the sink's credentials: they lack a "
            "permission the target needs, to read, list, write or delete its objects; grant "
            "it, then start the stream again)",
        )
    if isinstance(error, DeltaStreamError):
        return error
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None and isinstance(error, psycopg.Error):
        return _postgresql_permanent(description, error, what)
    deltalake = sys.modules.get("deltalake")
    if deltalake is not None:
        refused = _delta_permanent(description, error, what)
        if refused is not None:
            return refused
    return SinkRejectedError(description, f"{what}: {_one_line(error)}")


#: A request refused for want of a permission or credentials, as delta-rs reports it:
#: ``object_store``'s ``PermissionDenied`` and ``Unauthenticated`` errors (an object store's
#: 403 and 401), and a local file's ``EACCES``.
_DENIED = re.compile(
    r"lacked the necessary privileges|lacked valid authentication credentials|"
    r"Permission denied \(os error 13\)"
)


def _denied(error: BaseException) -> bool:
    """Whether ``error`` is a store's refusal of the sink's credentials (not one of
    deltastream's own errors: its stores raise :class:`AccessDeniedError` for those)."""
    if isinstance(error, DeltaStreamError):
        return False
    return isinstance(error, PermissionError) or bool(_DENIED.search(str(error)))


def _named(error: BaseException) -> str:
    first = str(error).strip().splitlines()
    return f"{type(error).__name__}: {first[0] if first else ''}".rstrip(": ")


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text.removeprefix("connection failed: ")


# ------------------------------------------------------------------ Delta (delta-rs)


#: delta-rs's ``CommitFailedError`` messages for a commit that lost to another writer's (the
#: version it was to take exists; with no retries inside delta-rs, "Failed to commit
#: transaction: 0"), or a conflict its checker found. Its other ``CommitFailedError``\ s
#: are refusals a retry meets again: an append-only table (``delta.appendOnly``) and a
#: commit removing rows, reader or writer features delta-rs does not support.
_DELTA_CONFLICT = re.compile(
    r"Failed to commit transaction: \d+|existing table version|already exists|concurrent|"
    r"conflict",
    re.IGNORECASE,
)
#: delta-rs's message for a file of the table gone from the store while a commit read it
#: (VACUUM by the table's owner after the sink's view of the table): loaded again, the
#: table no longer lists it.
_DELTA_FILE_GONE = re.compile(r"Object at location .* not found|No such file or directory")
#: delta-rs's message for rows that break a CHECK constraint or a NOT NULL column.
_DELTA_INVALID = re.compile(r"Invalid data found: (\d+) rows? failed validation check")


def _delta_transient(error: BaseException) -> str | None:
    """A commit that lost to a concurrent writer (a ``CommitFailedError`` that is a
    conflict), a file of the table removed under the commit (VACUUM), or an I/O failure of
    the store (an ``OSError``, classified by the caller)."""
    import deltalake

    text = str(error)
    if isinstance(error, deltalake.exceptions.CommitFailedError):
        return _named(error) if _DELTA_CONFLICT.search(text) else None
    if _DELTA_FILE_GONE.search(text):
        return _named(error)
    return None


def _delta_permanent(description: str, error: Exception, what: str) -> DeltaStreamError | None:
    """The error for a delta-rs refusal the target's definition makes (a constraint, the
    append-only property), saying which; ``None`` for any other."""
    text = str(error)
    invalid = _DELTA_INVALID.search(text)
    if invalid:
        return SinkRejectedError(
            description,
            f"{what}: the table refused {invalid.group(1)} row(s) that break one of its "
            "CHECK constraints or NOT NULL columns (delta-rs: "
            f"{_one_line(error).split(' Preview of invalid data')[0]}); nothing of it was "
            "committed",
        )
    if "append-only" in text:
        return SinkRejectedError(
            description,
            f"{what}: the table is append-only (delta.appendOnly=true), and the delivery "
            "removes or rewrites rows (a mirror's deletes and updates do); nothing of it was "
            "committed. Use an append-only table for a change log (mode=append) only",
        )
    return None


# ------------------------------------------------------------------ PostgreSQL (psycopg)

#: libpq's connection errors that retrying cannot fix (they carry no SQLSTATE): credentials,
#: TLS, a database or role that does not exist, a bad connection option.
#: (Not any "SSL": a TLS connection lost says "SSL SYSCALL error: EOF detected".)
_PERMANENT_CONNECT = re.compile(
    r"password|authentication|no pg_hba\.conf entry|does not exist|SSL was required|"
    r"does not support SSL|certificate|invalid (?:connection option|\w+ value)|"
    r"unsupported|not permitted",
    re.IGNORECASE,
)
#: SQLSTATE classes and codes worth retrying: connection exceptions, insufficient resources
#: (too many connections), operator intervention (a server shutting down, a statement
#: cancelled), system errors, serialization failures, deadlocks and a lock not granted in
#: time (a ``lock_timeout`` set for the role while an owner's ``VACUUM FULL`` or ``CLUSTER``
#: holds the table). Every other SQLSTATE is permanent: integrity constraints (class 23:
#: CHECK, NOT NULL, unique, foreign key), data exceptions (class 22: a value the column's
#: type refuses), a missing privilege (42501) or object (class 42), a feature PostgreSQL
#: does not have (0A000), a read-only transaction (25006).
_TRANSIENT_CLASSES = ("08", "53", "57", "58")
_TRANSIENT_CODES = ("40001", "40P01", "55P03")


def _postgresql_transient(error: psycopg.Error) -> str | None:
    """A connection lost or refused for a reason that may pass, a server short of
    resources or shutting down, a serialization failure or deadlock (by SQLSTATE)."""
    import psycopg

    state = error.sqlstate
    if state is None:
        # libpq's own errors: a connection refused, reset or lost (or a refusal it reports
        # the same way: a password, TLS, a database that does not exist).
        if isinstance(error, psycopg.OperationalError | psycopg.InterfaceError) and not (
            _PERMANENT_CONNECT.search(str(error))
        ):
            return _one_line(error)
        return None
    if state[:2] in _TRANSIENT_CLASSES or state in _TRANSIENT_CODES:
        return f"{state} {_one_line(error)}"
    return None


def _postgresql_permanent(description: str, error: psycopg.Error, what: str) -> DeltaStreamError:
    """The error for a psycopg error retrying cannot fix: a row refused (its message,
    detail and context), a grant missing, anything else in one line."""
    import psycopg

    if isinstance(error, psycopg.DataError | psycopg.IntegrityError):
        diag = error.diag
        problem = f"PostgreSQL refused a row of {what}: {diag.message_primary or error}"
        if diag.message_detail:
            problem += f" ({diag.message_detail})"
        if diag.context:
            problem += f"; {' '.join(diag.context.split())}"
        return SinkRejectedError(description, f"{problem}; nothing of it was committed")
    if isinstance(error, psycopg.errors.InsufficientPrivilege):
        return SinkRejectedError(
            description,
            f"{what}: {_one_line(error)} (the sink's role lacks a grant it needs: see the "
            "grants in the PostgreSQL sink's documentation)",
        )
    return SinkRejectedError(description, f"{what}: {_one_line(error)}")
