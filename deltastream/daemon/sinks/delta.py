"""The ``delta:URI`` sink: a stream's change rows appended to a Delta table, or (with
``?mode=merge&key=…``) a mirror of the source table kept in one, exactly once through the
Delta protocol's own mechanism for it, the ``txn`` action.

Every commit this sink makes to its target carries a ``txn`` action whose ``appId`` names the
stream and its source table (:func:`app_id`: ``deltastream:{stream}:{table id}``) and whose
``version`` is the delivery's end position (:func:`encode_position`, monotonic in stream
order). The rows and the position so land in one atomic commit, and :meth:`DeltaSink.recover`
reads the position back with deltastream's own log reader and hands it to the tailer as a
:class:`~deltastream.daemon.delivery.HeldPosition`: the stream resumes exactly where the
target is, so a crash after the target's commit and before the state's repeats nothing, and
one before it loses nothing. After a failed commit the sink reads the ``txn`` again before
retrying, so a commit that landed although its call failed is not made twice.

One writer per target: every commit is made with no retries inside delta-rs, so it lands
only on the table version its checks read: the stream's ``txn`` where this process left it,
no newer epoch of the stream (the ``txn`` :func:`epoch_app_id`, set by every commit; a
resumed stream claims the table with a commit of it alone, :meth:`DeltaSink.recover`), and,
before the stream's first commit, no other stream's ``txn`` (a table the first commit finds
missing is created only if still missing). A process whose checks fail gives the stream up
(:class:`~deltastream.errors.SinkFencedError`) or, another stream having taken the table,
stops (:class:`~deltastream.errors.SinkInUseError`), nothing committed. Each run marks its
commits (:func:`writer_app_id`) so that a lost response is told from another's commit, and
names the stream, epoch and process in ``commitInfo``. A target found empty while the
stream's state says its last commit left rows there was emptied by hand, and is refused.

Modes:

* ``append`` (default): each delivery's rows, every data column then ``_change_type``,
  ``_commit_version`` and ``_commit_timestamp``, in one ``write_deltalake`` append.
* ``merge``: the target holds the source table's rows (data columns only) as of the
  delivered position, by the mirror rule (:mod:`~deltastream.daemon.sinks.mirror`: each
  version's removals, then its additions; a key that is not unique in the source stops the
  stream). Per delivery, one ``MERGE`` deletes the keys whose last change is a removal and
  writes the others. Before it, the keys the delivery adds anew are looked up in the target
  (their key columns only, in the files whose statistics or partition values may hold
  them): one found there is a second row with that key in the source, and nothing is
  committed.

A missing target is created with the rows' schema (``partition_by=`` columns, and
``checkpoint_interval=N``, the table property ``delta.checkpointInterval`` that delta-rs's
post-commit hook writes a checkpoint by). Each value is written exactly or not at all, by
the one rule of what a column holds (:func:`~deltastream.daemon.sinks.exact.fit`): the rows
are cast to a target column's type when it holds theirs (a wider one made beforehand), new
columns and nested fields reach the target by Delta schema merge, and a type the target's
column cannot hold, one the protocol widens (delta-rs has no type widening) or a column the
rows lack raises :class:`~deltastream.errors.SinkSchemaError` naming the column, both types
and the fix, as a merge key missing or null raises
:class:`~deltastream.errors.SinkRejectedError`; nothing is committed then. A target
holding another stream's ``txn`` is refused
(:class:`~deltastream.errors.SinkRecoveryError` naming the stream), and so is an existing
target that holds rows no stream's ``txn`` accounts for: a stream appends to, or merges
into, a new table, an empty one (made beforehand with the user's own properties, or emptied
by a reset) or its own. Whether a table holds rows is read from its log alone, with
deltastream's log reader: the live files' ``numRecords`` statistics less their deletion
vectors' cardinality (:func:`rows_in`; a file without statistics counts as holding rows). A
commit that loses to a concurrent writer or fails in the store is retried with the project's
backoff (:func:`~deltastream.storage.retry.backoff_delay`), each retry reported to the
``retry_listener``; a refusal a retry meets again (a CHECK or NOT NULL constraint,
``delta.appendOnly``) stops the stream at once (:mod:`~deltastream.daemon.sinks.failures`).
Before every commit the sink's view of the target is brought up to date and, when another
writer committed, loaded anew and checked as at start (:meth:`DeltaSink._target_changed`): the
owner's maintenance (OPTIMIZE, VACUUM, checkpoints) costs nothing, and a target emptied,
removed or replaced while the stream runs is refused at its next delivery. A target whose
``txn`` for the stream is
found behind the stream's position (reset or replaced while the stream ran: read after a
failed commit, and whenever the sink loads the table anew) stops the stream instead, nothing
committed.

Reset (:meth:`DeltaSink.reset`, ``deltastream reset``): one commit (delta-rs's ``delete``
without a predicate: every file removed, none read or written) removes every row of a
target holding the stream's ``txn`` and sets that ``txn``'s version to :data:`RELEASED`
(-1). A negative version is *released* (:func:`is_released`, the one place saying so): it
owns nothing, so the stream starts afresh and another stream may take the emptied table. A
target of another stream is refused before the reset records itself, touching nothing; a
table with none of the stream's ``txn`` is left as it is.

``deltalake`` (delta-rs) is the writer, in the ``delta`` extra; it is imported on first use.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar, cast
from urllib.parse import parse_qs

import anyio
import anyio.to_thread
import pyarrow as pa
import pyarrow.compute as pc

from deltastream.daemon.crashpoints import crash_point
from deltastream.daemon.delivery import (
    COMMIT_ROWS_PER_DELIVERY,
    Delivery,
    Guarantee,
    HeldPosition,
    Position,
    Sink,
    StreamRef,
)
from deltastream.daemon.sinks.common import (
    SPEC_FORMS,
    _check_retry_options,
    _fenced,
    _reset_hint,
    log,
)
from deltastream.daemon.sinks.delta_columns import (
    exact_rows,
    fit_rows,
    key_ranges,
    quote,
    target_keys,
)
from deltastream.daemon.sinks.failures import (
    RetryableConflict,
    permanent_error,
    transient_cause,
)
from deltastream.daemon.sinks.mirror import (
    ADDED_FIRST,
    DELETE,
    FLAGS,
    duplicate_key_error,
    mirror_changes,
)
from deltastream.errors import (
    AccessDeniedError,
    InvalidArgumentError,
    ObjectNotFoundError,
    SinkError,
    SinkFencedError,
    SinkInUseError,
    SinkRecoveryError,
    SinkRejectedError,
    StorageError,
    TableNotFoundError,
)
from deltastream.log.paths import commit_key
from deltastream.read.predicates.stats import StatsReader
from deltastream.read.row_ids import ROW_ID
from deltastream.snapshot.loader import load_table_state
from deltastream.snapshot.reconcile import LogState
from deltastream.storage import open_store, require_extra
from deltastream.storage.paths import store_kind
from deltastream.storage.retry import RetryPolicy, call_with_retries

if TYPE_CHECKING:
    import deltalake

__all__ = [
    "EPOCH_APP_PREFIX",
    "RELEASED",
    "WRITER_APP_PREFIX",
    "DeltaSink",
    "DeltaSpec",
    "StreamTxn",
    "app_id",
    "decode_position",
    "delta_storage_options",
    "encode_position",
    "epoch_app_id",
    "is_released",
    "owning_txns",
    "parse_app_id",
    "rows_in",
    "writer_app_id",
]

T = TypeVar("T")

#: Every ``appId`` this sink writes starts so: others (a Spark query's) are not streams'.
APP_ID_PREFIX: Final = "deltastream:"
#: A position's offset takes the low 31 bits of a txn version, the snapshot flag the next
#: one, and the table version the rest (up to 2**31: a txn version is a signed long).
_OFFSET_BITS: Final = 31
_VERSION_LIMIT: Final = 1 << 31


def app_id(stream: str, table_id: str) -> str:
    """The ``txn`` appId of ``stream``'s commits of rows of table ``table_id``."""
    return f"{APP_ID_PREFIX}{stream}:{table_id}"


#: The ``appId`` prefix of the ``txn`` holding a stream's epoch in a target.
EPOCH_APP_PREFIX: Final = "deltastream-epoch:"


def epoch_app_id(stream: str) -> str:
    """The ``txn`` appId whose version is the epoch of the last process of ``stream`` that
    claimed or committed to the target (see :class:`DeltaSink`). Not an :func:`app_id`: it
    owns nothing, and a reset leaves it (epochs only grow)."""
    return f"{EPOCH_APP_PREFIX}{stream}"


#: The ``appId`` prefix of the ``txn`` naming the sink run that made a stream's last commit.
WRITER_APP_PREFIX: Final = "deltastream-writer:"


def writer_app_id(stream: str) -> str:
    """The ``txn`` appId whose version is a random number drawn by each run of the sink
    (:meth:`DeltaSink.recover`) and set by its every commit: after a failed call, it tells
    whether the commit that landed is this run's own (a lost response) or another
    process's, even one of the same epoch."""
    return f"{WRITER_APP_PREFIX}{stream}"


def process_name() -> str:
    """``host:pid``, for a commit's ``commitInfo``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def parse_app_id(value: str) -> tuple[str, str] | None:
    """The stream and table id an :func:`app_id` names; ``None`` for any other appId.
    (Stream names hold no ``:``, so the first one after the prefix ends the name.)"""
    if not value.startswith(APP_ID_PREFIX):
        return None
    stream, sep, table_id = value.removeprefix(APP_ID_PREFIX).partition(":")
    return (stream, table_id) if sep and stream else None


def encode_position(position: Position) -> int:
    """A ``txn`` version for ``position``: ``version << 32 | snapshot << 31 | offset``, which
    orders as positions do (:func:`decode_position` reads it back)."""
    if position.offset >= 1 << _OFFSET_BITS or position.version >= _VERSION_LIMIT:
        raise InvalidArgumentError(
            f"position {position} cannot be a Delta txn version: the offset must be below "
            f"2**31 rows (a version with more change rows than that cannot be delivered to a "
            f"delta target) and the version below 2**31"
        )
    return (position.version << 32) | (int(position.snapshot) << _OFFSET_BITS) | position.offset


def decode_position(txn_version: int) -> Position:
    if is_released(txn_version):
        raise ValueError(f"not a deltastream position: {txn_version} (a released txn)")
    offset = txn_version & ((1 << _OFFSET_BITS) - 1)
    return Position(txn_version >> 32, bool(txn_version >> _OFFSET_BITS & 1), offset)


#: The ``txn`` version a reset commits for the stream it releases (see :func:`is_released`).
RELEASED: Final = -1


def is_released(txn_version: int) -> bool:
    """Whether a deltastream ``txn`` version says its stream was released by a reset (the
    commit that removed the stream's rows): any negative version, since every position
    encodes to one >= 0 (:func:`encode_position`). A released ``txn`` owns nothing: another
    stream may take the (emptied) table, and its own stream starts it afresh. (The Delta
    protocol's ``txn.version`` is any long; delta-rs writes, reads and checkpoints a
    negative one as it is.)"""
    return txn_version < 0


@dataclass(frozen=True)
class StreamTxn:
    """A deltastream ``txn`` of a target that owns it (not released)."""

    stream: str
    table_id: str
    app_id: str
    version: int


def owning_txns(txns: Mapping[str, int]) -> list[StreamTxn]:
    """The ``txn`` versions of a target (by appId) that make it a stream's: those of
    :func:`app_id`'s form, not released (:func:`is_released`), in appId order."""
    owning = []
    for app, version in sorted(txns.items()):
        parsed = parse_app_id(app)
        if parsed is not None and not is_released(version):
            owning.append(StreamTxn(parsed[0], parsed[1], app, version))
    return owning


def rows_in(files: pa.Table) -> tuple[int, int | None]:
    """How many of a table's live files (``add`` actions, as deltastream's log reader
    reconciles them) may hold rows, and how many rows they hold (``None``: some file's
    statistics do not say). A file holds ``numRecords`` rows less its deletion vector's
    cardinality; one without ``numRecords`` may hold rows. Nothing but the log is read."""
    if not files.num_rows:
        return 0, 0
    records = StatsReader(files, ()).num_records
    deleted = pc.fill_null(pc.struct_field(files["deletionVector"], "cardinality"), 0)
    live = pc.subtract(records, deleted)
    empty = pc.fill_null(pc.equal(live, pa.scalar(0, pa.int64())), False)
    holding = files.num_rows - int(pc.sum(pc.cast(empty, pa.int64())).as_py() or 0)
    known = None if live.null_count else int(pc.sum(live).as_py() or 0)
    return holding, known


# ------------------------------------------------------------------------------ the spec

_MODES = ("append", "merge")
_SPEC_KEYS = ("mode", "key", "partition_by", "checkpoint_interval")


@dataclass(frozen=True)
class DeltaSpec:
    """What a ``delta:`` spec says: ``URI[?mode=append|merge&key=a,b&partition_by=c,d
    &checkpoint_interval=N]``."""

    uri: str
    mode: Literal["append", "merge"] = "append"
    keys: tuple[str, ...] = ()
    partition_by: tuple[str, ...] = ()
    checkpoint_interval: int | None = None

    @classmethod
    def parse(cls, text: str) -> DeltaSpec:
        uri, _, query = text.partition("?")
        spec = f"delta:{text}"
        if not uri.strip():
            raise InvalidArgumentError(f"sink {spec!r} names no table; accepted: {SPEC_FORMS}")
        values: dict[str, str] = {}
        for key, given in parse_qs(query, keep_blank_values=True).items():
            if key not in _SPEC_KEYS:
                raise InvalidArgumentError(
                    f"sink {spec!r}: unknown setting {key!r} (known: {', '.join(_SPEC_KEYS)})"
                )
            if len(given) > 1:
                raise InvalidArgumentError(f"sink {spec!r}: {key!r} is given twice")
            values[key] = given[0]

        def names(key: str) -> tuple[str, ...]:
            items = tuple(n.strip() for n in values.get(key, "").split(",") if n.strip())
            if any("`" in n for n in items):
                raise InvalidArgumentError(f"sink {spec!r}: {key!r} names must not hold '`'")
            return items

        mode = values.get("mode", "append")
        if mode not in _MODES:
            raise InvalidArgumentError(
                f"sink {spec!r}: mode must be one of {', '.join(_MODES)}, not {mode!r}"
            )
        keys = names("key")
        if mode == "merge" and not keys:
            raise InvalidArgumentError(f"sink {spec!r}: mode=merge needs key=COLUMN[,COLUMN...]")
        if mode == "append" and keys:
            raise InvalidArgumentError(f"sink {spec!r}: key= applies to mode=merge only")
        interval: int | None = None
        if "checkpoint_interval" in values:
            text_value = values["checkpoint_interval"]
            if not text_value.isdigit() or int(text_value) < 1:
                raise InvalidArgumentError(
                    f"sink {spec!r}: checkpoint_interval must be a whole number >= 1, "
                    f"not {text_value!r}"
                )
            interval = int(text_value)
        return cls(uri.strip(), mode, keys, names("partition_by"), interval)  # type: ignore[arg-type]


def delta_storage_options(uri: str, options: Mapping[str, str] | None) -> dict[str, str]:
    """deltalake's ``storage_options`` for a target at ``uri`` given deltastream's store
    options (each store's own names, checked by the store's option parser as for any
    table): the same endpoint and credentials, in delta-rs's names. The retry and timeout
    options are the deltastream stores' and have no delta-rs counterpart here."""
    kind = store_kind(uri)
    if kind == "file":
        if options:
            raise InvalidArgumentError(
                f"{uri}: storage options {sorted(options)} only apply to tables in object "
                "stores (s3://, gs://, Azure)"
            )
        return {}
    if kind == "s3":
        from deltastream.storage.s3 import S3Options

        s3 = S3Options.from_storage_options(options)
        out = {
            "AWS_ENDPOINT_URL": s3.endpoint_url,
            "AWS_REGION": s3.region or "us-east-1",
            "AWS_ACCESS_KEY_ID": s3.access_key_id,
            "AWS_SECRET_ACCESS_KEY": s3.secret_access_key,
            "AWS_SESSION_TOKEN": s3.session_token,
            "AWS_PROFILE": None if s3.access_key_id else s3.profile,
        }
        if s3.endpoint_url and s3.endpoint_url.lower().startswith("http://"):
            out["AWS_ALLOW_HTTP"] = "true"
        if s3.addressing_style in ("path", "virtual"):
            style = s3.addressing_style == "virtual"
            out["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "true" if style else "false"
        return {k: v for k, v in out.items() if v is not None}
    if kind == "az":
        from deltastream.storage.azure.options import (
            EMULATOR_ACCOUNT,
            EMULATOR_KEY,
            AzureOptions,
            emulator_account_url,
        )
        from deltastream.storage.azure.uri import parse_azure_uri

        az = AzureOptions.from_storage_options(options)
        location = parse_azure_uri(uri)
        account = az.account_for(uri, location.account)
        # The emulator's well-known key, when the store would use it too.
        emulator = az.use_emulator or (az.endpoint_url is not None and account == EMULATOR_ACCOUNT)
        key = az.account_key or (EMULATOR_KEY if emulator and not az.sas_token else None)
        endpoint = az.endpoint_url or (az.account_url(account, None) if az.use_emulator else None)
        out = {
            "azure_storage_account_name": account,
            "azure_storage_account_key": key,
            "azure_storage_sas_key": az.sas_token,
            "azure_storage_client_id": az.client_id,
            "azure_storage_client_secret": az.client_secret,
            "azure_storage_tenant_id": az.tenant_id,
            "azure_endpoint": endpoint,
        }
        if emulator and endpoint == emulator_account_url(account):
            # Azurite at the address delta-rs's emulator mode derives: use that mode, whose
            # listings of the log filter names client-side. Outside it, object_store lists
            # from a version with the List Blobs ``startFrom`` parameter, which Azurite before
            # 3.37.0 ignores: delta-rs then finds version 0 where it asked for the read
            # version and fails every commit after a table's second ("Invalid table
            # version: 1").
            del out["azure_endpoint"]
            out["azure_storage_use_emulator"] = "true"
        elif endpoint and endpoint.lower().startswith("http://"):
            out["azure_allow_http"] = "true"
        return {k: v for k, v in out.items() if v is not None}
    from deltastream.storage.gcs.options import DEFAULT_ENDPOINT, GcsOptions

    gcs = GcsOptions.from_storage_options(options)
    google: dict[str, str] = {}
    if gcs.endpoint_url.rstrip("/") != DEFAULT_ENDPOINT:
        # object_store speaks GCS's XML API there (the JSON API's host serves both).
        google["google_base_url"] = gcs.endpoint_url
    if gcs.service_account_info is not None:
        google["google_service_account_key"] = json.dumps(dict(gcs.service_account_info))
    if gcs.skip_signature:
        google["google_skip_signature"] = "true"
        # object_store 0.13 authorizes uploads whatever skip_signature says, asking the
        # metadata server for a token when it has no credentials: a key with OAuth
        # disabled has them carry an empty one instead.
        google.setdefault("google_service_account_key", _NO_OAUTH_KEY)
    return google


#: object_store's service account key for a GCS that takes no credentials (an emulator).
_NO_OAUTH_KEY: Final = json.dumps(
    {"disable_oauth": True, "client_email": "", "private_key": "", "private_key_id": ""}
)


def _deltalake() -> Any:
    """The ``deltalake`` package (imported on first use: it is large, and only this sink
    needs it)."""
    import deltalake

    return deltalake


# ------------------------------------------------------------------------------ the sink


class DeltaSink(Sink):
    """Appends a stream's change rows to a Delta table, or keeps a mirror of the source
    table in one (``delta:URI[?mode=merge&key=…]``); exactly-once through the ``txn`` action
    (see the module docstring). ``storage_options``: deltastream's options for the target's
    store (the stream's ``sink_options``). Failed commits are retried with backoff
    (``base_delay``, capped at ``max_delay``) up to ``max_attempts`` (``None``: forever).
    """

    guarantee: Guarantee = "exactly-once"
    #: Each delivery is one commit, whose fixed cost dominates small deliveries.
    rows_per_delivery = COMMIT_ROWS_PER_DELIVERY

    def __init__(
        self,
        spec: str,
        *,
        storage_options: Mapping[str, str] | None = None,
        max_attempts: int | None = None,
        base_delay: float = 0.5,
        max_delay: float = 30.0,
    ) -> None:
        self._spec = f"delta:{spec}"
        self.target = DeltaSpec.parse(spec)
        if self.target.mode == "merge":
            self.change_order = "removals-first"
            self.row_ids = ROW_ID in self.target.keys
        uri = self.target.uri
        if store_kind(uri) == "file" and "://" not in uri:
            uri = str(Path(uri).expanduser().absolute())
        self.uri = uri
        require_extra(self._spec, "delta", "deltalake", what="sink")
        _check_retry_options(max_attempts, base_delay, max_delay)
        self.max_attempts = max_attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._store_options = dict(storage_options or {})
        self._delta_options = delta_storage_options(uri, storage_options)
        self._stream: str | None = None
        #: The txn version the target holds for the stream (``None``: none yet).
        self._held: int | None = None
        #: The target as last loaded or committed to (``None``: load it again).
        self._table: deltalake.DeltaTable | None = None
        self._checked_properties = False
        #: The next commit creates the table (its checks found none), failing if it exists.
        self._create_only = False
        #: Whether the target held rows after the last commit.
        self._holds_rows = False
        #: The stream (set by recover).
        self._ref: StreamRef | None = None
        #: The target's metadata id as this sink loaded or created it (see _check_reloaded).
        self._table_id: str | None = None
        #: This run's mark in its commits (:func:`writer_app_id`), drawn by recover.
        self._writer = 0
        #: Commits that failed and were retried, for tests and metrics.
        self.retries = 0

    @property
    def description(self) -> str:
        return self._spec

    def output_claim(self, stream: str) -> str | None:
        # A target's txn names one stream: two streams of a configuration cannot share it.
        return f"delta:{self.uri}"

    # -------------------------------------------------------------- recovery

    async def _target_state(
        self, *, files: bool = False, version: int | None = None
    ) -> LogState | None:
        """The target's state (at ``version``; default the latest) read with deltastream's
        log reader (with ``files``, its live files too); ``None`` if there is no table at
        the target yet."""
        try:
            async with open_store(self.uri, self._store_options) as store:
                state, _ = await load_table_state(store, version, files=files)
        except TableNotFoundError:
            return None
        except AccessDeniedError as e:  # a grant is missing: the stream stops (exit 2)
            raise permanent_error(self._spec, e, "reading the target's log failed") from e
        return state

    async def _target_txns(self) -> Mapping[str, int] | None:
        """The target's ``txn`` versions by appId; ``None`` if there is no table yet."""
        state = await self._target_state()
        return None if state is None else {a: t.version for a, t in state.txns.items()}

    def _owned(self, txns: Mapping[str, int], stream: StreamRef, *, reset: bool) -> list[StreamTxn]:
        """``stream``'s owning txns of the target; another stream's raises, naming it (at a
        reset as :class:`SinkInUseError`, like the other sinks' resets: nothing touched)."""
        ours = []
        for txn in owning_txns(txns):
            if txn.stream != stream.name:
                problem = (
                    f"the table at {self.uri} is owned by another stream, {txn.stream!r} (txn "
                    f"appId {txn.app_id!r}, up to {decode_position(txn.version)}); a delta "
                    "target holds one stream's rows: "
                )
                if reset:
                    raise SinkInUseError(
                        self._spec,
                        problem + f"a reset of {stream.name!r} leaves it alone; nothing was "
                        f"touched. To start {txn.stream!r} over, reset that stream",
                    )
                raise SinkRecoveryError(
                    self._spec, problem + f"give stream {stream.name!r} a table of its own"
                )
            ours.append(txn)
        return ours

    async def recover(
        self, stream: StreamRef, committed: Position | None, state: Mapping[str, Any]
    ) -> HeldPosition | None:
        self._stream = stream.name
        self._ref = stream
        self._table = None
        self._table_id = None
        self._writer = secrets.randbits(62)
        txns = await self._target_txns()
        ours = self._owned(txns or {}, stream, reset=False)
        if len(ours) > 1:
            tables = ", ".join(t.table_id for t in ours)
            raise SinkRecoveryError(
                self._spec,
                f"the table at {self.uri} holds rows of stream {stream.name!r} from several "
                f"tables ({tables}); give the stream a table of its own",
            )
        await self._claim(stream, txns)
        if ours:
            self._held = ours[0].version
            held = decode_position(ours[0].version)
            if committed == held and state.get("rows"):
                await self._check_not_emptied(stream, held)
            self._holds_rows = bool(state.get("rows"))
            return HeldPosition(held, ours[0].table_id)
        self._held = None
        recorded = state.get("txn") if committed is not None else None
        if isinstance(recorded, int):
            raise self._lost(
                stream, recorded, txns, "restored from before the stream's first commit"
            )
        if txns is not None:
            await self._check_empty()
        return None

    def _lost(
        self,
        stream: StreamRef,
        recorded: int,
        txns: Mapping[str, int] | None,
        otherwise: str,
        context: str = "",
        done: str = "nothing was touched",
    ) -> SinkRecoveryError:
        """The error for a target that holds none of the stream's rows although its state
        (or this process) says rows up to ``recorded`` (a txn version) were committed there:
        at start and at every delivery alike (``txns``: the target's, ``None``: no table)."""
        released = any(
            is_released(version) and parsed is not None and parsed[0] == stream.name
            for app, version in (txns or {}).items()
            for parsed in [parse_app_id(app)]
        )
        if released:
            how = "the stream's rows were removed by a reset (its txn is released)"
        elif txns is None:
            how = "the table was removed"
        else:
            how = f"the target was replaced, or {otherwise}"
        return SinkRecoveryError(
            self._spec,
            f"{context}the table at {self.uri} holds no rows of stream {stream.name!r}, but its "
            f"state in {stream.state_uri} says rows up to {decode_position(recorded)} "
            f"were committed there: {how}; {done}. " + _reset_hint(stream, self._spec),
        )

    async def _claim(self, stream: StreamRef, txns: Mapping[str, int] | None) -> None:
        """Choose the epoch this sink's commits carry: above the target's, and at least the
        one the stream claimed through its state (:attr:`StreamRef.epoch`), so that the
        process that starts last takes the stream over (a standby from a frozen holder, a
        restarted process from a stale one; a state restored from an older copy too). A
        stream claimed through its state records it in an existing target at once, in a
        commit of the epoch ``txn`` alone, so that an older process commits nothing more. A
        new stream's is recorded with its first commit (two processes starting a new stream
        on one state directory: the state lets one through, whose epoch no claim of the
        other can have raised)."""
        held = (txns or {}).get(epoch_app_id(stream.name), 0)
        self.epoch = max(stream.epoch, held + 1)
        if not stream.epoch or txns is None:
            return  # a new stream, or no table yet: the first commit records it

        async def attempt() -> None:
            try:
                await anyio.to_thread.run_sync(self._commit_claim)
            except Exception as e:
                if transient_cause(e) is None:
                    raise
                self._table = None
                now = (await self._target_txns() or {}).get(epoch_app_id(stream.name), 0)
                if now >= self.epoch:  # another process claimed it meanwhile
                    raise self._fenced(now, "while this one claimed it") from e
                raise

        await self._retrying("claim", f"the claim of epoch {self.epoch}", attempt)

    async def _check_unowned(self, what: str) -> None:
        """Before the stream's first commit to the target: the table version that commit
        will land on (delta-rs retries nothing) holds no other stream's txn, and no rows
        unless some are the stream's. A table created or taken by another stream since
        :meth:`recover` is refused, nothing written."""
        seen = await anyio.to_thread.run_sync(self._loaded_version)
        if seen is None:
            return  # none yet: this commit creates it, unless another one did first
        state = await self._target_state(version=seen)
        txns = {} if state is None else {a: t.version for a, t in state.txns.items()}
        self._refuse_other_owner(txns, f"before the commit of {what}, ")
        if not any(t.stream == self._stream for t in owning_txns(txns)):
            await self._check_empty(seen)

    def _target_holds_rows(self) -> bool:
        """Whether the target (as this sink last committed to it) holds rows, by its live
        files' statistics (a file without them counts as holding rows)."""
        table = self._load()
        if table is None:
            return False
        files = pa.table(table.get_add_actions(flatten=True))
        if not files.num_rows:
            return False
        if "num_records" not in files.column_names:
            return True
        records = files.column("num_records").to_pylist()
        return any(n is None or n > 0 for n in records)

    def _loaded_version(self) -> int | None:
        """The version of the target :meth:`_commit` will commit on (``None``: none yet,
        and then it creates one, or fails if another writer did meanwhile)."""
        table = self._load()
        self._create_only = table is None
        return None if table is None else int(table.version())

    def _commit_claim(self) -> None:
        table = self._load()
        if table is None:
            return  # removed meanwhile
        now = table.transaction_version(epoch_app_id(self._stream or "")) or 0
        if now >= self.epoch:
            raise self._fenced(now, "while this one claimed it")
        self._commit_txns(table, self._properties([], "claim"))

    def _fenced(self, epoch: int, when: str) -> SinkFencedError:
        where = f"the table at {self.uri}"
        return _fenced(self._spec, self._stream, where, epoch, self.epoch, when)

    def _refuse_other_owner(self, txns: Mapping[str, int], context: str) -> None:
        """Raise :class:`SinkInUseError` if another stream's txn owns the target (it took
        the table since :meth:`recover`: two streams started on one new or empty target)."""
        others = [t.stream for t in owning_txns(txns) if t.stream != self._stream]
        if others:
            raise SinkInUseError(
                self._spec,
                f"{context}stream {others[0]!r} took the table at {self.uri} meanwhile; a "
                "delta target holds one stream's rows: nothing was committed",
            )

    def _properties(self, txns: Sequence[tuple[str, int]], what: str, *, epoch: bool = True) -> Any:
        """The ``CommitProperties`` of a commit of this sink: the ``txn`` actions (with the
        stream's epoch, but for a reset's), who wrote it in ``commitInfo``, and no retries
        by delta-rs: a commit lands on exactly the table version its checks read, or fails
        and is checked again (see :meth:`deliver`)."""
        dl = _deltalake()
        stream = self._stream or ""
        actions = [dl.Transaction(a, v) for a, v in txns]
        info: dict[str, Any] = {"deltastream.stream": stream}
        if epoch:  # a reset holds no epoch: it runs outside any stream's process
            actions.append(dl.Transaction(epoch_app_id(stream), self.epoch))
            actions.append(dl.Transaction(writer_app_id(stream), self._writer))
            info["deltastream.epoch"] = self.epoch
        info |= {"deltastream.process": process_name(), "deltastream.operation": what}
        return dl.CommitProperties(
            app_transactions=actions, max_commit_retries=0, custom_metadata=info
        )

    async def _check_not_emptied(self, stream: StreamRef, held: Position) -> None:
        """The stream's state says the target held rows after its last commit (at the
        position the target holds): a target that holds none now was emptied outside
        deltastream, and resuming would leave the mirror or change log without them."""
        state = await self._target_state(files=True)
        if state is None or rows_in(state.files)[0]:
            return
        raise self._emptied(stream, held)

    def _emptied(
        self,
        stream: StreamRef,
        held: Position,
        context: str = "",
        done: str = "nothing was touched",
    ) -> SinkRecoveryError:
        """The error for a target found holding no rows where the stream left some: at
        start and at every delivery alike."""
        return SinkRecoveryError(
            self._spec,
            f"{context}the table at {self.uri} holds no rows, but the stream's txn says its "
            f"rows up to {held} were committed there, and its state in {stream.state_uri} "
            f"that rows were left: it was emptied outside deltastream; {done}. "
            + _reset_hint(stream, self._spec),
        )

    async def _target_changed(self, seen: int) -> bool:
        """Whether anything but this sink committed to the target since its view of it (at
        version ``seen``): a commit after ``seen`` is there, or the commit ``seen`` is gone
        or is not one of this run's (it carries no ``txn`` of :func:`writer_app_id` with
        this run's mark: the table was removed or replaced, or another writer's commit was
        taken in since). One ``HEAD`` and one read of a small file of the log."""
        mark = writer_app_id(self._stream or "")
        try:
            async with open_store(self.uri, self._store_options) as store:
                try:
                    await store.head(commit_key(seen + 1))
                    return True
                except ObjectNotFoundError:
                    pass
                body = await store.get(commit_key(seen))
        except ObjectNotFoundError:
            return True
        for line in body.splitlines():
            txn = json.loads(line).get("txn") if line.strip() else None
            if txn and txn.get("appId") == mark and txn.get("version") == self._writer:
                return False
        return True

    def _check_reloaded(self, app: str, what: str) -> None:
        """The target loaded anew after another writer committed to it (maintenance:
        OPTIMIZE, Z-order, VACUUM; or an emptied, removed or replaced table), so that no
        commit reads files removed meanwhile, and checked as at start: it must still be the
        stream's, the same table (its metadata id), the stream's txn where this process
        left it, and rows if the stream left rows. Anything else raises, nothing
        committed."""
        self._table = None
        fresh = self._load()
        ref, held = self._ref, self._held
        assert ref is not None and held is not None
        context = f"the commit of {what} found the target changed by another writer: "
        done = "nothing was committed"
        if fresh is None:
            raise self._lost(ref, held, None, "", context, done)
        found = fresh.transaction_version(app)
        txns = {} if found is None else {app: found}
        if found is None or str(fresh.metadata().id) != self._table_id:
            raise self._lost(
                ref, held, txns, "another table written at its location", context, done
            )
        epoch = fresh.transaction_version(epoch_app_id(self._stream or "")) or 0
        self._check_fence(found, epoch, context)
        if self._holds_rows and not self._target_holds_rows():
            raise self._emptied(ref, decode_position(held), context, done)

    async def _check_empty(self, version: int | None = None) -> None:
        """An existing target that no stream owns must hold no rows (created empty, or
        emptied and released by a reset): a stream neither appends to nor merges into rows
        it did not write, and a reset never removes them. Counted from the log alone
        (:func:`rows_in`): no data file is read. (At ``version``: default the latest.)"""
        state = await self._target_state(files=True, version=version)
        if state is None:  # removed meanwhile: the first commit creates it
            return
        holding, rows = rows_in(state.files)
        if not holding:
            return
        what = f"{rows} row(s)" if rows is not None else "rows"
        raise SinkRecoveryError(
            self._spec,
            f"the table at {self.uri} holds rows that no stream's txn accounts for ({what} in "
            f"{holding} data file(s)); deltastream writes only to a new or empty Delta table, "
            "or one it owns: name another target, or empty this one",
        )

    # -------------------------------------------------------------- retries

    async def _retrying(self, operation: str, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()`` retried with backoff while it fails for a reason retrying may
        help (:func:`~deltastream.daemon.sinks.failures.transient_cause`), each retry
        counted and reported; the last failure (or a permanent one) as a
        :class:`SinkError` saying ``what`` failed."""

        def counted() -> None:
            self.retries += 1

        try:
            return await call_with_retries(
                attempt,
                operation=operation,
                target=self.uri,
                policy=RetryPolicy(
                    self.max_attempts or sys.maxsize, self.base_delay, self.max_delay
                ),
                transient=transient_cause,
                listener=self.retry_listener,
                on_retry=counted,
                logger=log,
            )
        except SinkError:
            raise
        except AccessDeniedError as e:  # a grant is missing: the stream stops (exit 2)
            raise permanent_error(self._spec, e, f"{what} failed") from e
        except StorageError as e:  # the retries ran out
            raise SinkError(self._spec, f"{what} failed: {e.problem}") from e
        except Exception as e:  # what a retry cannot fix: the stream stops (exit 2)
            raise permanent_error(self._spec, e, f"{what} failed") from e

    # -------------------------------------------------------------- delivery

    async def deliver(self, delivery: Delivery) -> Mapping[str, Any]:
        if self._stream is None:
            raise RuntimeError(f"{self._spec}: recover() must be called before deliver()")
        state = {} if self._held is None else {"txn": self._held, "rows": self._holds_rows}
        if not delivery.num_rows:
            # Nothing to commit: the target's position stays behind, and a restart there
            # plans the versions after it again, finding no rows.
            return state
        app = app_id(self._stream, delivery.table_id)
        version = encode_position(delivery.end)
        if self._held is not None and self._held >= version:
            log.warning(
                "%s: already holds %s of stream %s; not committed again",
                self._spec,
                delivery.end,
                self._stream,
            )
            return state
        data = pa.Table.from_batches(delivery.batches, delivery.schema)
        if self.target.mode == "merge":
            data = await anyio.to_thread.run_sync(
                mirror_changes, data, self.target.keys, self._spec
            )
        what = f"{delivery.num_rows} rows of {delivery.table} ({delivery.start} to {delivery.end})"

        async def attempt() -> None:
            if self._held is None:
                await self._check_unowned(what)
            elif self._table is not None and await self._target_changed(self._table.version()):
                await anyio.to_thread.run_sync(self._check_reloaded, app, what)
            try:
                await anyio.to_thread.run_sync(self._commit, data, app, version, delivery)
            except Exception as e:
                cause = transient_cause(e)
                if cause is None:
                    raise
                self._table = None  # another writer moved the table: load it again
                # The failed call may have committed after all (a lost response): the txns
                # say, before anything is retried.
                txns = await self._target_txns() or {}
                self._create_only = False
                held, epoch = txns.get(app), txns.get(epoch_app_id(self._stream or ""), 0)
                writer = txns.get(writer_app_id(self._stream or ""))
                if held is not None and held >= version and writer == self._writer:
                    log.warning(
                        "%s: the commit of %s failed (%s), but the target holds it: not repeated",
                        self._spec,
                        what,
                        cause,
                    )
                    return
                # The writer that won may be another stream (a target both started on), a
                # process of this stream that took it over, or a reset or a replacement of
                # the table: a retry would commit into what it left.
                self._refuse_other_owner(txns, f"the commit of {what} failed ({cause}): ")
                self._check_fence(held, epoch, f"the commit of {what} failed ({cause}), and ")
                raise

        await self._retrying("commit", f"commit of {what}", attempt)
        crash_point("sink.after-write")
        self._held = version
        # Whether the target held rows after it: a restart refuses a target emptied since.
        # A row appended or written by the merge is there; only a delivery of removals alone
        # may have emptied a mirror, and then the table's statistics say.
        if self.target.mode == "append" or not pc.all(data[DELETE]).as_py():
            self._holds_rows = True
        else:
            self._holds_rows = await anyio.to_thread.run_sync(self._target_holds_rows)
        return {"txn": version, "rows": self._holds_rows}

    # -------------------------------------------------------------- reset

    @contextlib.asynccontextmanager
    async def reset_lock(self, stream: StreamRef) -> AsyncIterator[None]:
        # A target owned by another stream is refused before the reset records itself, so
        # that the refusal changes nothing. (A Delta target has no lock to hold: a stream
        # running on it meanwhile stops at its next commit, see _check_fence.)
        self._owned(await self._target_txns() or {}, stream, reset=True)
        yield

    async def reset(self, stream: StreamRef) -> list[str]:
        """Remove every row of the target and release the stream's ``txn`` (its version
        set to :data:`RELEASED`), in one commit, when the target holds the stream's txn;
        a target of another stream is refused, touching nothing; anything else (no table,
        or none of the stream's) is left as it is."""
        self._stream = stream.name
        self._table = None
        ours = self._owned(await self._target_txns() or {}, stream, reset=True)
        if not ours:
            return []
        apps = [t.app_id for t in ours]
        removed: list[str] = []

        async def attempt() -> None:
            try:
                done = await anyio.to_thread.run_sync(self._release, apps)
            except Exception as e:
                if transient_cause(e) is None:
                    raise
                self._table = None
                txns = await self._target_txns() or {}
                now = [txns.get(a) for a in apps]
                if all(v is not None and is_released(v) for v in now):
                    log.warning(
                        "%s: the reset's commit failed (%s), but the target holds it: not repeated",
                        self._spec,
                        transient_cause(e),
                    )
                    removed[:] = [f"the rows of delta:{self.uri} (the stream's txn released)"]
                    return
                if None in now:  # not a retry's to remove: the table was replaced
                    raise SinkRecoveryError(
                        self._spec,
                        f"the reset's commit failed ({transient_cause(e)}), and the table at "
                        f"{self.uri} no longer holds the stream's txn: it was replaced "
                        "meanwhile; nothing was removed",
                    ) from e
                raise
            if done is not None:
                rows, version = done
                removed[:] = [f"the rows of delta:{self.uri} ({rows} rows, commit v{version})"]

        await self._retrying("reset", "the reset", attempt)
        crash_point("reset.output-file")
        self._held = None
        return removed

    def _release(self, apps: Sequence[str]) -> tuple[int, int] | None:
        """One commit removing every file of the target (no data file is read or written)
        with the ``txn`` of each of ``apps`` at :data:`RELEASED`: the rows it removed and
        its version (``None``: the table is gone). A target without files takes a commit
        of the ``txn`` alone (delta-rs's delete commits nothing when nothing is removed)."""
        dl = _deltalake()
        props = self._properties([(a, RELEASED) for a in apps], "reset", epoch=False)
        hooks = dl.PostCommitHookProperties(create_checkpoint=True)
        table = self._load()
        if table is None:  # removed meanwhile: no rows, no txn left
            return None
        before = table.version()
        metrics = table.delete(commit_properties=props, post_commithook_properties=hooks)
        if table.version() == before:
            self._commit_txns(table, props)
        return int(metrics.get("num_deleted_rows") or 0), table.version()

    def _load(self) -> deltalake.DeltaTable | None:
        """The target, loaded once and then kept current by the sink's own commits (which
        update it in place): a commit made against it after another writer's commit is
        checked for conflicts by delta-rs, and on a conflict the sink loads it again."""
        if self._table is None:
            dl = _deltalake()
            try:
                self._table = dl.DeltaTable(self.uri, storage_options=self._delta_options)
            except dl.exceptions.TableNotFoundError:
                return None
            if self._table_id is None:
                self._table_id = str(self._table.metadata().id)
        return self._table

    def _check_fence(self, held: int | None, epoch: int, context: str = "") -> None:
        """Raise if the target no longer holds the stream where this process left it
        (``held``: its txn for the stream now; ``epoch``: the stream's epoch there): behind
        it or gone, the target was reset or replaced while the stream ran
        (:class:`SinkRecoveryError`); a newer epoch, or a position moved on, means another
        process of the stream took it over (:class:`SinkFencedError`). Nothing is committed
        either way."""
        if epoch > self.epoch:
            raise self._fenced(epoch, "")
        found = "none" if held is None else _describe_txn(held)
        if held is not None and is_released(held):
            held = None  # a reset released it: the stream holds nothing there
        if held == self._held:
            return
        if self._held is not None and (held is None or held < self._held):
            raise SinkRecoveryError(
                self._spec,
                f"{context}the table at {self.uri} no longer holds the stream's position "
                f"{decode_position(self._held)} (its txn: {found}): the target was reset or "
                "replaced while the stream ran; nothing was committed"
                + ("" if self._ref is None else ". " + _reset_hint(self._ref, self._spec)),
            )
        assert held is not None
        mine = "none" if self._held is None else str(decode_position(self._held))
        if epoch < self.epoch:
            # An older process committed after this one claimed the stream, before the
            # claim reached the table (a new stream records it with its first commit): it
            # loses at its state's next commit. This one resumes where the table is.
            raise SinkError(
                self._spec,
                f"{context}an older process of stream {self._stream!r} (epoch {epoch}, this "
                f"one's {self.epoch}) committed its rows up to {_describe_txn(held)} to the "
                f"table at {self.uri} after this one took the stream over; nothing was "
                "committed, and the stream restarts from the table's position",
            )
        raise SinkFencedError(
            self._spec,
            f"{context}another process of stream {self._stream!r} committed to the table at "
            f"{self.uri}: it holds the stream's rows up to {_describe_txn(held)}, not "
            f"{mine} where this process left them (epoch {self.epoch}, the table's {epoch}); "
            "nothing was committed, and this process gives the stream up",
            self.epoch,
        )

    def _commit(self, data: pa.Table, app: str, version: int, delivery: Delivery) -> None:
        dl = _deltalake()
        props = self._properties([(app, version)], f"{delivery.start}..{delivery.end}")
        hooks = dl.PostCommitHookProperties(create_checkpoint=True)
        merge = self.target.mode == "merge"
        # Where the first commit's checks found no table, it creates one, whatever is there
        # by now: a table another writer created meanwhile makes the creation fail.
        table = None if self._create_only else self._load()
        if table is not None:
            # What this commit lands on: the stream's position where this process left it,
            # and no newer epoch. delta-rs does not retry (max_commit_retries=0), so a commit
            # of another writer after these reads fails this one, which is checked again.
            epoch = table.transaction_version(epoch_app_id(self._stream or "")) or 0
            self._check_fence(table.transaction_version(app), epoch)
        elif self._held is not None:
            self._check_fence(None, 0)
        if table is None:
            rows = data
            if merge:  # a new mirror: the keys whose last change is no removal
                rows = data.filter(pc.invert(data[DELETE])).drop_columns(list(FLAGS))
            self._create(rows, props, hooks)
            return
        self._check_properties(table)
        columns = data.schema if not merge else data.drop_columns(list(FLAGS)).schema
        written, added = self._fit(table, columns)
        data = exact_rows(self._spec, self.uri, data, written)
        if merge:
            self._refuse_duplicates(table, data)
            if pc.all(pc.and_not(data[ADDED_FIRST], data[DELETE])).as_py():
                # Only keys the target was just found not to hold: an append does what the
                # MERGE would, without joining the target again.
                merge, data = False, data.drop_columns(list(FLAGS))
        if merge and added:
            # delta-rs 1.6.6's MERGE with merge_schema loses the struct values of the rows it
            # copies from rewritten files when a nested field is added: the schema is merged
            # first, in a commit of its own (no rows; the stream's epoch and mark, not its
            # position), and the MERGE then writes into the merged schema.
            self._merge_schema(table, data.select(columns.names).slice(0, 0))
            added = ()
        if not merge:
            if not added:  # the target's column order (the same columns)
                data = data.select([f.name for f in table.schema().fields])
            dl.write_deltalake(
                table,
                data,
                mode="append",
                schema_mode="merge" if added else None,
                commit_properties=props,
                post_commithook_properties=hooks,
            )
            return
        predicate = " AND ".join(
            [*key_ranges(data, self.target.keys)]
            + [f"t.{quote(k)} = s.{quote(k)}" for k in self.target.keys]
        )
        flag = f"s.{quote(DELETE)}"
        before = table.version()
        (
            table.merge(
                data,
                predicate,
                source_alias="s",
                target_alias="t",
                commit_properties=props,
                post_commithook_properties=hooks,
            )
            .when_matched_delete(predicate=flag)
            .when_matched_update_all(except_cols=list(FLAGS))
            .when_not_matched_insert_all(predicate=f"NOT {flag}", except_cols=list(FLAGS))
            .execute()
        )
        if table.version() == before:
            # A merge that changes nothing (keys added and removed within the delivery)
            # commits nothing in delta-rs: the position still must reach the table.
            self._commit_txns(table, props)

    def _merge_schema(self, table: deltalake.DeltaTable, empty: pa.Table) -> None:
        """A commit of no rows that merges ``empty``'s schema into the target's (Delta
        schema merge: new columns and nested fields), carrying the stream's epoch and this
        run's mark like every commit of the sink, but not its position."""
        dl = _deltalake()
        dl.write_deltalake(
            table,
            empty,
            mode="append",
            schema_mode="merge",
            commit_properties=self._properties([], "schema"),
        )
        table.update_incremental()

    def _commit_txns(self, table: deltalake.DeltaTable, props: Any) -> None:
        """A commit of ``props``' txns (and ``commitInfo``) alone, no data file."""
        dl = _deltalake()
        table.create_write_transaction(
            [],
            mode="append",
            schema=table.schema(),
            partition_by=list(table.metadata().partition_columns) or None,
            commit_properties=props,
            post_commithook_properties=dl.PostCommitHookProperties(create_checkpoint=True),
        )
        table.update_incremental()

    def _refuse_duplicates(self, table: deltalake.DeltaTable, data: pa.Table) -> None:
        """Raise :func:`duplicate_key_error` if the target holds a key the delivery adds
        anew (its first change an addition: :data:`ADDED_FIRST`). Only the key columns of
        the files that may hold one are read: the others are pruned by their partition
        values and statistics against the range of the keys looked up."""
        keys = list(self.target.keys)
        wanted = data.filter(data[ADDED_FIRST]).select([*keys, FLAGS[2]])
        if not wanted.num_rows:
            return
        found = target_keys(table, wanted.select(keys))
        if not found.num_rows:
            return
        hits = wanted.join(found, keys, join_type="inner")
        if hits.num_rows:
            first = hits.sort_by(FLAGS[2]).slice(0, 1).to_pylist()[0]
            raise duplicate_key_error(
                self._spec, keys, [first[k] for k in keys], int(first[FLAGS[2]])
            )

    def _create(self, rows: pa.Table, props: Any, hooks: Any) -> None:
        dl = _deltalake()
        missing = [c for c in self.target.partition_by if c not in rows.column_names]
        if missing:
            raise SinkRejectedError(
                self._spec,
                f"partition_by column(s) {', '.join(missing)} are not in the rows (columns: "
                f"{', '.join(rows.column_names)}); nothing was committed",
            )
        interval = self.target.checkpoint_interval
        try:
            # Create only ("error": fail if a table is there): another writer may have
            # created one since this commit's checks found none.
            dl.write_deltalake(
                self.uri,
                rows,
                mode="error",
                partition_by=list(self.target.partition_by) or None,
                configuration=None
                if interval is None
                else {"delta.checkpointInterval": str(interval)},
                storage_options=self._delta_options,
                commit_properties=props,
                post_commithook_properties=hooks,
            )
        except dl.exceptions.DeltaError as e:
            if "already exists" not in str(e):
                raise
            raise _TableAppearedError(str(e)) from e
        self._create_only = False
        log.info(
            "%s: created the Delta table %s (%d columns%s)",
            self._spec,
            self.uri,
            rows.num_columns,
            f", partitioned by {', '.join(self.target.partition_by)}"
            if self.target.partition_by
            else "",
        )
        self._table = dl.DeltaTable(self.uri, storage_options=self._delta_options)
        self._table_id = str(self._table.metadata().id)

    def _check_properties(self, table: deltalake.DeltaTable) -> None:
        """On the first commit to an existing table: its partitioning must be the one the
        spec asks for, and its checkpoint interval is set to the spec's."""
        if self._checked_properties:
            return
        metadata = table.metadata()
        wanted = list(self.target.partition_by)
        if wanted and list(metadata.partition_columns) != wanted:
            raise SinkRejectedError(
                self._spec,
                f"the table at {self.uri} is partitioned by "
                f"({', '.join(metadata.partition_columns)}), not by ({', '.join(wanted)}) as "
                "the spec says; nothing was committed",
            )
        interval = self.target.checkpoint_interval
        key = "delta.checkpointInterval"
        if interval is not None and metadata.configuration.get(key) != str(interval):
            table.alter.set_table_properties({key: str(interval)})
        self._checked_properties = True

    def _fit(
        self, table: deltalake.DeltaTable, rows: pa.Schema
    ) -> tuple[pa.Schema, tuple[str, ...]]:
        """The schema the rows are written in and what they add to the target
        (:func:`~deltastream.daemon.sinks.delta_columns.fit_rows`)."""
        start_over = _reset_hint(self._ref, self._spec) if self._ref else "deltastream reset"
        target = pa.schema(cast(Any, table.schema().to_arrow()))
        written, added = fit_rows(self._spec, self.uri, start_over, target, rows)
        if added:
            log.info(
                "%s: adding %s to %s (the source's schema gained them)",
                self._spec,
                ", ".join(added),
                self.uri,
            )
        return written, added


def _describe_txn(version: int) -> str:
    """A deltastream txn version for messages: the position, or ``released``."""
    return "released" if is_released(version) else str(decode_position(version))


class _TableAppearedError(RetryableConflict):
    """A table was created at the target after the checks of a commit that was to create
    it: the commit is checked again against that table (a retry)."""
