"""The exceptions deltastream raises, in one small hierarchy.

Every error a user can act on is a :class:`DeltaStreamError`. Messages always name the
file (or URI) and the problem, so a one-line CLI report is enough to start debugging.
Whether retrying later may help is a property of the class (:attr:`DeltaStreamError.transient`,
:func:`is_transient`): only ``StorageError`` (but ``StateConflictError``) and ``SinkError``
(but its subclasses) are transient.

    DeltaStreamError
    ├── InvalidArgumentError          a bad URI, option or version/timestamp argument
    ├── StorageError                  the object store failed (after retries)
    │   ├── ObjectNotFoundError       a key that must exist does not
    │   ├── AccessDeniedError         a permission or valid credentials are missing (401, 403)
    │   └── PreconditionFailedError   a conditional write lost to another writer
    │       └── StateConflictError    another tailer wrote this stream's state
    ├── TableNotFoundError            the location holds no Delta table
    ├── TableReplacedError            the table a reader followed is gone, or another one is there
    ├── LogError                      the log itself is not a valid Delta log
    │   ├── CorruptFileError          a log file cannot be parsed
    │   │   ├── CorruptCommitError
    │   │   ├── CorruptCheckpointError
    │   │   ├── CorruptLastCheckpointError
    │   │   └── CorruptVersionChecksumError
    │   ├── MissingVersionsError      commits the segment needs are absent
    │   ├── IncompleteCheckpointError a multi-part checkpoint lacks parts and nothing else covers it
    │   ├── InvalidTableStateError    e.g. no protocol or no metadata after replay
    │   ├── LogFileTooLargeError      a JSON log file is over the size deltastream will parse
    │   └── UnsafePathError           the log names a file outside the table root
    ├── UnsupportedFeatureError       the table needs a reader feature deltastream lacks
    ├── VersionNotFoundError          time travel to a version the log cannot reconstruct
    ├── TimestampOutOfRangeError      time travel to a timestamp outside the table's history
    ├── ChecksumMismatchError         the snapshot disagrees with the version checksum file
    ├── DataFileError                 a data or change-data file cannot be read as the log says
    │   └── DataFileNotFoundError     ... because it is gone (vacuumed)
    ├── DeletionVectorError           a deletion vector is missing, corrupt or inconsistent
    ├── ChangeDataError               the change data feed cannot be produced for a range
    │   ├── ChangeDataNotEnabledError versions changed rows while the feed was off
    │   └── SchemaChangeError         the range crosses a schema change it cannot read safely
    ├── ResetIncompleteError          a stream's reset was interrupted: run it again to finish
    ├── StreamHeldError               a running replica of the stream's group holds it
    └── SinkError                     a sink cannot deliver rows (retrying would not help)
        ├── HttpStatusError           an HTTP sink's endpoint rejected a delivery
        ├── SinkRecoveryError         the sink's output does not match the stream's state
        ├── SinkInUseError            another stream owns the sink's output
        ├── SinkFencedError           another process took the stream over (a newer epoch)
        ├── SinkRejectedError         the target cannot take the rows (a value, a null key)
        │   └── SinkSchemaError       ... their schema does not fit the target's
        └── OutputClosedError         the reader of the sink's output went away (a closed pipe)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import ClassVar

__all__ = [
    "AccessDeniedError",
    "ChangeDataError",
    "ChangeDataNotEnabledError",
    "ChecksumMismatchError",
    "CorruptCheckpointError",
    "CorruptCommitError",
    "CorruptFileError",
    "CorruptLastCheckpointError",
    "CorruptVersionChecksumError",
    "DataChangeInStreamError",
    "DataFileError",
    "DataFileNotFoundError",
    "DeletionVectorError",
    "DeltaStreamError",
    "HttpStatusError",
    "IncompleteCheckpointError",
    "InvalidArgumentError",
    "InvalidTableStateError",
    "LogError",
    "LogFileTooLargeError",
    "MissingVersionsError",
    "ObjectNotFoundError",
    "OutputClosedError",
    "PreconditionFailedError",
    "ResetIncompleteError",
    "SchemaChangeError",
    "SinkError",
    "SinkFencedError",
    "SinkInUseError",
    "SinkRecoveryError",
    "SinkRejectedError",
    "SinkSchemaError",
    "StateConflictError",
    "StorageError",
    "StreamHeldError",
    "TableNotFoundError",
    "TableReplacedError",
    "TimestampOutOfRangeError",
    "UnsafePathError",
    "UnsupportedFeatureError",
    "VersionNotFoundError",
    "is_transient",
]


class DeltaStreamError(Exception):
    """Base class of every error deltastream raises on purpose."""

    #: Whether retrying the work later may succeed: the store or the sink was unavailable,
    #: not wrong. A daemon restarts a stream after a transient error and stops it for good
    #: after any other; see :func:`is_transient`.
    transient: ClassVar[bool] = False


class InvalidArgumentError(DeltaStreamError, ValueError):
    """A caller passed a value deltastream cannot use (URI, option, version, timestamp)."""


class StorageError(DeltaStreamError, OSError):
    """The object store failed to answer, after any retries. ``uri`` names the object."""

    transient = True

    def __init__(self, uri: str, problem: str) -> None:
        super().__init__(f"{uri}: {problem}")
        self.uri = uri
        self.problem = problem


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """A key that must exist does not."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri, "not found")


class AccessDeniedError(StorageError):
    """The store refused a request for want of a permission or of valid credentials (HTTP
    401 or 403, a local file's ``EACCES``). Transient for a stream's source, which the
    daemon keeps retrying visibly until the grant is fixed; a sink stops on it at once
    (:func:`deltastream.daemon.sinks.failures.permanent_error`)."""


class PreconditionFailedError(StorageError):
    """A conditional write found the object changed (or present) since it was last read."""

    def __init__(self, uri: str, problem: str = "changed by another writer") -> None:
        super().__init__(uri, problem)


class StateConflictError(PreconditionFailedError):
    """Another tailer wrote this stream's state since this one last did."""

    transient = False


class TableNotFoundError(DeltaStreamError):
    """The location holds no Delta table: it does not exist, is a file, or has no
    ``_delta_log`` or an empty one (the message says which)."""

    def __init__(
        self, uri: str, problem: str = "not a Delta table: no commits or checkpoints in _delta_log"
    ) -> None:
        super().__init__(f"{uri}: {problem}")
        self.uri = uri


class TableReplacedError(DeltaStreamError):
    """The table a reader (a stream, a Spark query) followed is no longer at its location:
    it was deleted, replaced by another table (a new ``metaData.id``), or its log went back
    to before versions the reader had already read. Never transient: reading on would mix
    two tables' rows. ``expected_id`` is the id the reader followed, ``found_id`` the id
    there now (``None``: no table there)."""

    def __init__(
        self, uri: str, expected_id: str, found_id: str | None, problem: str, remedy: str
    ) -> None:
        found = f"the table there now is {found_id}" if found_id else "no table is there now"
        super().__init__(
            f"{uri}: the table was replaced: {problem}; the reader followed table "
            f"{expected_id}, {found}; {remedy}"
        )
        self.uri = uri
        self.expected_id = expected_id
        self.found_id = found_id


class LogError(DeltaStreamError):
    """The transaction log is not a valid Delta log."""


class CorruptFileError(LogError):
    """A log file cannot be parsed. ``path`` is the file, ``problem`` what is wrong with it."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class CorruptCommitError(CorruptFileError):
    """A JSON commit (or log compaction) file is not valid newline-delimited JSON actions."""


class CorruptCheckpointError(CorruptFileError):
    """A checkpoint part, V2 checkpoint or sidecar cannot be read."""


class CorruptLastCheckpointError(CorruptFileError):
    """``_delta_log/_last_checkpoint`` is not valid JSON or fails its checksum."""


class CorruptVersionChecksumError(CorruptFileError):
    """A ``.crc`` version checksum file cannot be parsed."""


def _version_ranges(versions: Iterable[int] | Iterable[range]) -> tuple[range, ...]:
    """Versions, or ranges of them, as sorted disjoint ranges (merged where they touch)."""
    spans = sorted(
        (v.start, v.stop) if isinstance(v, range) else (v, v + 1)
        for v in versions
        if not isinstance(v, range) or v.start < v.stop
    )
    out: list[list[int]] = []
    for lo, hi in spans:
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple(range(lo, hi) for lo, hi in out)


def _format_versions(ranges: Iterable[range]) -> str:
    """Render sorted disjoint ranges compactly: ``3, 5-9, 12``; at most ten runs, then how
    many more (a gap of a billion versions is one run, not a billion numbers)."""
    runs = [str(r.start) if r.stop - r.start == 1 else f"{r.start}-{r.stop - 1}" for r in ranges]
    shown = ", ".join(runs[:10])
    return shown if len(runs) <= 10 else f"{shown} and {len(runs) - 10} more run(s)"


class MissingVersionsError(LogError):
    """Commits needed to reconstruct a version are absent from the log. ``ranges`` holds the
    missing versions as ranges (bounded, however large the gap); ``missing`` lists them one
    by one."""

    def __init__(
        self, log_uri: str, missing: Iterable[int] | Iterable[range], detail: str = ""
    ) -> None:
        self.ranges = _version_ranges(missing)
        count = sum(r.stop - r.start for r in self.ranges)
        msg = f"{log_uri}: missing commit version(s) {_format_versions(self.ranges)}"
        if count > 1:
            msg += f" ({count:,} versions)" if count > 10 else ""
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)
        self.log_uri = log_uri

    @property
    def missing(self) -> tuple[int, ...]:
        """Every missing version (for small gaps; ``ranges`` for any)."""
        return tuple(v for r in self.ranges for v in r)


class IncompleteCheckpointError(LogError):
    """A multi-part checkpoint lacks parts and no other checkpoint or commits cover it."""


class InvalidTableStateError(LogError):
    """Replaying the log did not produce a valid table state (e.g. no protocol or metadata)."""


#: How a user asks for the changes of versions written without change data, for messages.
INFER_WITHOUT_CDF = (
    "--infer-without-cdf (infer_without_cdf=True in Python, infer_without_cdf = true in the "
    "TOML, the Spark option inferWithoutCdf)"
)


def option_changes(recorded: Mapping[str, str], current: Mapping[str, str]) -> str:
    """How option values ``current`` differ from ``recorded``, for messages: each option
    whose value changed, old and new (``not set`` for one at its default)."""

    def shown(value: str | None) -> str:
        return "not set" if value is None else repr(value)

    return "; ".join(
        f"{name} {shown(recorded.get(name))}, now {shown(current.get(name))}"
        for name in sorted(recorded.keys() | current.keys())
        if recorded.get(name) != current.get(name)
    )


#: How a user lets a table's log name files outside the table root, for messages.
ALLOW_EXTERNAL_PATHS = (
    "--allow-external-paths [ROOT ...] (allow_external_paths in Python and in the TOML, "
    "the Spark option allowExternalPaths)"
)


class LogFileTooLargeError(LogError):
    """A commit, log compaction or JSON checkpoint is larger than deltastream agrees to
    parse in memory (``limit`` bytes, raised with the environment variable ``setting``)."""

    def __init__(self, path: str, size: int, limit: int, setting: str) -> None:
        super().__init__(
            f"{path}: the file is {size:,} bytes, over the limit of {limit:,} bytes on one "
            f"JSON log file (raise it with the environment variable {setting})"
        )
        self.path = path
        self.size = size
        self.limit = limit


class UnsafePathError(LogError):
    """The log names a data, change-data or deletion-vector file outside the table root,
    which deltastream does not read unless asked to. ``source`` is the log file (or the
    table), ``version`` the version whose action names ``path``."""

    def __init__(self, source: str, version: int | None, path: str, root: str) -> None:
        where = f"{source}: version {version}" if version is not None else source
        super().__init__(
            f"{where}: {path!r} is outside the table ({root}); deltastream reads only files "
            f"under the table root unless allowed with {ALLOW_EXTERNAL_PATHS}"
        )
        self.source = source
        self.version = version
        self.path = path


class UnsupportedFeatureError(DeltaStreamError):
    """The table requires a reader version or reader feature deltastream does not implement."""

    def __init__(self, uri: str, feature: str, detail: str = "") -> None:
        msg = f"{uri}: unsupported reader feature {feature!r}"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)
        self.uri = uri
        self.feature = feature


class VersionNotFoundError(DeltaStreamError):
    """The requested version is outside what the log can reconstruct."""

    def __init__(self, uri: str, version: int, earliest: int | None, latest: int | None) -> None:
        if latest is None:
            detail = "the table has no versions"
        elif earliest is None:
            detail = f"the log holds versions up to {latest}, but none it can reconstruct"
        else:
            detail = f"available versions are {earliest}..{latest}"
        super().__init__(f"{uri}: cannot load version {version}: {detail}")
        self.uri = uri
        self.version = version
        self.earliest = earliest
        self.latest = latest


class TimestampOutOfRangeError(DeltaStreamError):
    """The requested timestamp falls before the first or after the last commit."""


class ChecksumMismatchError(DeltaStreamError):
    """The reconstructed snapshot disagrees with the version checksum (``.crc``) file."""

    def __init__(self, path: str, field: str, expected: object, actual: object) -> None:
        super().__init__(
            f"{path}: field {field!r} differs: checksum file has {expected!r}, "
            f"log replay gives {actual!r}"
        )
        self.path = path
        self.field = field
        self.expected = expected
        self.actual = actual


class DataFileError(DeltaStreamError):
    """A data file (or change-data file) cannot be read as the log describes it.

    ``path`` is the file, ``version`` the table version whose action named it (if known).
    """

    def __init__(self, path: str, problem: str, version: int | None = None) -> None:
        where = f" (named by version {version})" if version is not None else ""
        super().__init__(f"{path}{where}: {problem}")
        self.path = path
        self.problem = problem
        self.version = version


class DataFileNotFoundError(DataFileError):
    """A data file the log references no longer exists (typically removed by VACUUM)."""

    def __init__(self, path: str, version: int | None = None) -> None:
        super().__init__(path, "file not found (vacuumed or deleted?)", version)


class DeletionVectorError(DeltaStreamError):
    """A deletion vector is missing, fails its checksum, or does not match its descriptor.

    ``path`` names the deletion vector (its file, or the data file for an inline one).
    """

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class ChangeDataError(DeltaStreamError):
    """The change data feed cannot be produced for the requested range."""


class ChangeDataNotEnabledError(ChangeDataError):
    """Versions in the range changed or deleted rows while the change data feed was not in
    force (the table property off, or writer version 7 without the ``changeDataFeed`` feature).

    ``versions`` lists them. Change data can still be inferred from add/remove actions on
    request, at the price of showing rewritten files as whole-file deletes and inserts.
    """

    def __init__(self, uri: str, versions: Iterable[int], *, stopped: str | None = None) -> None:
        self.versions = tuple(sorted(set(versions)))
        super().__init__(
            f"{uri}: change data is not available for version(s) "
            f"{_format_versions(_version_ranges(self.versions))}: they changed rows while the "
            "change data feed was not in force (delta.enableChangeDataFeed off, or writer "
            "version 7 without the changeDataFeed writer feature); to read them anyway, as "
            "whole-file deletes and inserts inferred from add/remove actions, pass "
            f"{INFER_WITHOUT_CDF}" + (f"; {stopped}" if stopped else "")
        )
        self.uri = uri


class SchemaChangeError(ChangeDataError):
    """The range crosses a schema change (a dropped column, a column renamed under column
    mapping, an incompatible type change) that cannot be read safely with the range's final
    schema, or a stream meets one it stops at."""

    def __init__(self, uri: str, version: int, problem: str) -> None:
        super().__init__(f"{uri}: version {version} {problem}")
        self.uri = uri
        self.version = version


class DataChangeInStreamError(ChangeDataError):
    """A stream of appended rows (not the change data feed) met a commit that deletes or
    rewrites data."""

    def __init__(self, uri: str, version: int, problem: str) -> None:
        super().__init__(f"{uri}: version {version} {problem}")
        self.uri = uri
        self.version = version


class ResetIncompleteError(DeltaStreamError):
    """A reset of the stream (``deltastream reset``) was started and did not finish: its
    sink output and state may be partly removed, so the stream must not resume from them.
    ``uri`` names the reset's record in the state directory; running the reset again (with
    the same sink and name) finishes it."""

    def __init__(self, uri: str, problem: str) -> None:
        super().__init__(f"{uri}: {problem}")
        self.uri = uri
        self.problem = problem


class StreamHeldError(DeltaStreamError):
    """A stream cannot run here: a live member of its replica group (a ``serve`` replica,
    or another run) holds the stream's shard. ``uri`` names the shard's lease record;
    nothing of the stream was touched."""

    def __init__(self, uri: str, problem: str) -> None:
        super().__init__(f"{uri}: {problem}")
        self.uri = uri
        self.problem = problem


class SinkError(DeltaStreamError):
    """A sink could not deliver rows and retrying would not help (or the retries ran out).

    ``sink`` names the destination (a URL, a command), ``problem`` says what went wrong.
    Transient: a destination that is down now may be up later; the subclasses are not.
    """

    transient = True

    def __init__(self, sink: str, problem: str) -> None:
        super().__init__(f"{sink}: {problem}")
        self.sink = sink
        self.problem = problem


class HttpStatusError(SinkError):
    """The HTTP endpoint answered with a status that retrying cannot fix (a 4xx other than
    408, 409 and 429, or a redirect). ``body`` is the start of the response body."""

    transient = False

    def __init__(self, url: str, status: int, reason: str, body: str) -> None:
        problem = f"POST rejected with HTTP {status} {reason}".rstrip()
        if body:
            problem += f": {body}"
        super().__init__(url, problem)
        self.url = url
        self.status = status
        self.body = body


class SinkRecoveryError(SinkError):
    """Resuming would touch output the stream cannot prove it wrote after its committed
    position: the output is shorter than committed, is not the output the state describes,
    or exists while the state has no position (or is older than the output). Nothing was
    changed; ``sink`` names the output, and the message the state and how to start over."""

    transient = False


class SinkInUseError(SinkError):
    """Another stream (in this process or another one) is writing to the same output."""

    transient = False


class SinkFencedError(SinkError):
    """Another process took the stream over: the target holds a newer epoch (fencing
    token) for it, or its position moved past this process's. Nothing of the delivery was
    committed; the process gives the stream up (it is not restarted: that would take the
    stream back from the process that holds it now). ``epoch``: this process's."""

    transient = False

    def __init__(self, sink: str, problem: str, epoch: int) -> None:
        super().__init__(sink, problem)
        self.epoch = epoch


class SinkRejectedError(SinkError):
    """The sink's target refused a delivery's rows for what they hold (a database's
    constraint or type: a NUL in text, a value out of a column's range; a merge key missing
    or null), or refused the work for good (a permission, a partitioning other than the
    spec's): retrying the same rows cannot succeed. Nothing of the delivery was committed;
    ``sink`` names the target."""

    transient = False


class SinkSchemaError(SinkRejectedError):
    """The target's schema does not fit the rows (a column missing, or of another kind), or
    the source's schema changed in a way the target cannot follow (a column dropped,
    renamed or retyped). The message names both schemas."""

    transient = False


class OutputClosedError(SinkError):
    """The reader of the sink's output went away for good: ``jsonl:-`` piped into a command
    that exited (``deltastream tail … --sink jsonl:- | head``). The rows of the delivery
    were not committed; the command line ends quietly, as on any closed pipe."""

    transient = False


def is_transient(error: BaseException) -> bool:
    """Whether work that failed with ``error`` may succeed if retried later: the error's
    class says so for deltastream's own errors (:attr:`DeltaStreamError.transient`); any
    other exception (an unexpected ``OSError`` such as a full disk, a bug) counts as
    transient, so that a daemon keeps trying, visibly, rather than stopping on it."""
    if isinstance(error, DeltaStreamError):
        return error.transient
    return isinstance(error, Exception)
