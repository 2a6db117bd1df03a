"""The ``postgresql://`` sink: change rows into a PostgreSQL table, exactly once.

Two modes, by the spec's ``mode``:

* ``append`` (the default): every change row, with ``_change_type``, ``_commit_version`` and
  ``_commit_timestamp``, is appended to the target table (a change log);
* ``merge`` (with ``key=COLUMN[,...]``): the target is a mirror of the source table: after
  each version's last delivery it holds exactly the source's rows as of that version, by
  the mirror rule (:mod:`~deltastream.daemon.sinks.mirror`: each version's removals, then
  its additions; one row per key per delivery). The keys whose last change is a removal
  are deleted, those the delivery adds anew are inserted (the unique index on the key
  refuses one the target holds: a second row with that key in the source), and the others
  upserted (``INSERT ... ON CONFLICT DO UPDATE``). A key that is not unique in the source
  stops the stream, naming it and its version; nothing of the delivery is committed.

Exactly once: each delivery is one transaction that loads the rows (``COPY`` in CSV, into
the target in append mode, into the session's temporary table then one ``DELETE`` and
``INSERT`` statements in merge mode) and moves the stream's row in the
offsets table (default ``deltastream_offsets``: ``stream``, ``target``, ``table_id``,
``version``, ``snapshot``, ``offset``, ``updated_at``) from the delivery's start to its end.
:meth:`recover` returns that position (:class:`~deltastream.daemon.delivery.HeldPosition`),
and the stream resumes there, whatever its state says. Each delivery first locks the row
and checks that it holds the delivery's start: a retry after a connection lost during
``COMMIT`` finds the delivery's end there and does nothing more (it was committed), and a
row moved by anything else stops the stream
(:class:`~deltastream.errors.SinkRecoveryError`) rather than write rows twice.

One writer per target: the offsets row holds the stream's epoch. A resumed stream claims it
in :meth:`recover` (waiting at most the spec's ``lock_timeout`` for a session holding the row,
then failing saying so), a new stream with its first delivery; a delivery finding a newer
epoch there, or its start not where the row is, gives the stream up
(:class:`~deltastream.errors.SinkFencedError`), writing nothing. The role's grants are checked
before anything is written (:func:`required_grants`); existing tables that fit are used with
no DDL. A target dropped, or emptied while the stream's state says its last delivery left
rows there, is refused rather than filled anew from the stream's position.

Ownership: the offsets row of a target table names the stream writing it (one row per target:
the ``target`` column is the primary key). :meth:`recover` claims the row; a target claimed
by another stream is refused (:class:`~deltastream.errors.SinkInUseError`, naming it), and so
is a target that already holds rows no stream's row accounts for.

Schemas, checked at every delivery before anything of it is written (one catalog query;
the checks below run again whenever the target or the source's columns changed): a missing
target is created with the mapped types
(:mod:`~deltastream.daemon.sinks.postgresql_types`; in merge mode with a primary key on the
key columns) and the comment :data:`CREATED_COMMENT`, which marks it as the sink's (it
survives a reset's ``TRUNCATE``, and goes with the table). Each target column must hold
every value of its source column exactly (:func:`~deltastream.daemon.sinks.exact.fit` on
the column's :func:`~deltastream.daemon.sinks.postgresql_types.capacity`). Where the
protocol widens the target's type to the source's (``numeric(10,2)`` to ``decimal(12,4)``,
``real`` to ``double``) a target the sink made is altered in the delivery's transaction
(``ALTER COLUMN … TYPE``, logged); a target made beforehand is never altered. A column new
in the source is added (``ALTER TABLE ADD COLUMN``, logged). A target column the source
lacks is the source's gone (it was among the columns of the last delivery, which the
sink's state keeps) or the owner's: an owner's column that is nullable or has a default
(or is an identity or generated column) is left to it, at every start alike. Anything else
(a column that does not hold the source's values, a column gone from or renamed in the
source, an owner's ``NOT NULL`` column without a default; in merge mode no unique index on
the key columns) stops the stream with :class:`~deltastream.errors.SinkSchemaError`, naming
each column, both types and the statement that fixes it (``ALTER COLUMN … TYPE``, ``RENAME
COLUMN``, ``DROP COLUMN``), and ``deltastream reset``. A source column whose name is longer
than PostgreSQL keeps (``max_identifier_length``) is refused, naming it. A row PostgreSQL
refuses (a NUL in text, a CHECK or NOT NULL constraint) or a null key in merge mode raises
:class:`~deltastream.errors.SinkRejectedError`; nothing of the delivery is committed.

The target at every delivery: dropped, or emptied (``TRUNCATE``, ``DELETE``, replaced by an
empty table) while the sink left rows in it, it is refused
(:class:`~deltastream.errors.SinkRecoveryError`, with the ``reset`` command) as at start.
The owner's maintenance (``VACUUM FULL``, ``CLUSTER``) only makes a delivery wait.

Text: the connection's ``client_encoding`` is UTF8, whatever else says; a database whose
encoding is not UTF8 (``LATIN1``, ``SQL_ASCII``: they cannot hold every character, or
store bytes unchecked) is refused on connecting, in one line naming it.

The connection: the spec is a libpq URI; the sink's own query parameters (``table``,
``mode``, ``key``, ``offsets_table``) are taken out and the rest (``sslmode``,
``sslrootcert``, ``host=/socket/dir``, ...) passed to libpq, which also reads
``PGPASSWORD``, ``.pgpass`` and the other ``PG*`` variables. ``${NAME}`` in the spec is the
environment variable NAME (read when the sink is made), so a password can come from the
environment through a TOML file. The password is never in the sink's description (logged,
stored in the state), its repr or its errors.

Failures: connection errors (refused, reset, lost), serialization failures, deadlocks, a
lock not granted in time and a server shutting down are retried with the project's backoff
(:func:`~deltastream.storage.retry.call_with_retries`), each retry reported to the stream;
other errors of PostgreSQL are permanent and raised at once (the classification:
:mod:`~deltastream.daemon.sinks.failures`).

The driver is psycopg 3 (the ``deltastream[postgresql]`` extra): it is libpq's, so
connection strings, ``.pgpass``, ``PGPASSWORD``, TLS settings and unix sockets behave as in
``psql``, and it has native asyncio connections and ``COPY FROM STDIN``. It is imported when
a sink connects; :func:`require_driver` turns its absence into one clear error.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

import anyio
import anyio.to_thread
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from deltastream.changes.columns import CDF_COLUMNS
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
    _check_retry_options,
    _fenced,
    _reset_hint,
    expand_env,
    log,
)
from deltastream.daemon.sinks.exact import Fit, fit, type_name
from deltastream.daemon.sinks.failures import permanent_error, transient_cause
from deltastream.daemon.sinks.mirror import FLAGS, duplicate_key_error, mirror_changes
from deltastream.daemon.sinks.postgresql_types import capacity, csv_ready, pg_type
from deltastream.errors import (
    InvalidArgumentError,
    SinkError,
    SinkFencedError,
    SinkInUseError,
    SinkRecoveryError,
    SinkRejectedError,
    SinkSchemaError,
    StorageError,
)
from deltastream.read.row_ids import ROW_ID
from deltastream.storage import require_extra
from deltastream.storage.retry import RetryPolicy, call_with_retries

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

__all__ = ["SCHEMES", "PostgresSink", "PostgresSpec", "require_driver", "required_grants"]

T = TypeVar("T")

#: The spec's schemes (libpq's two).
SCHEMES = ("postgresql", "postgres")
#: The query parameters the sink takes for itself; the others go to libpq.
_OWN = ("table", "mode", "key", "offsets_table", "lock_timeout")
#: How long claiming a stream waits for its offsets row (seconds), unless the spec says.
DEFAULT_LOCK_TIMEOUT = 10.0
DEFAULT_OFFSETS_TABLE = "deltastream_offsets"
#: The temporary table of merge mode.
_LOAD = "_deltastream_load"
#: Rows encoded at a time while the slice before is sent (about a megabyte of CSV).
_COPY_SLICE = 20_000
#: The comment on a target the sink made (``COMMENT ON TABLE``), which it follows the
#: source's type widening in: a target without it was made beforehand, and is not altered.
CREATED_COMMENT = "made by deltastream"


def require_driver(spec: str) -> None:
    """Refuse, in one line naming the extra, a PostgreSQL sink without its driver."""
    require_extra(spec, "postgresql", "psycopg", what="sink")


def _identifier(text: str, what: str, spec: str) -> str:
    if not text or "\0" in text or len(text.encode()) > 63:
        raise InvalidArgumentError(
            f"sink {spec}: {what} {text!r} is not a PostgreSQL name (1 to 63 bytes, no NUL)"
        )
    return text


def _qualified(text: str, what: str, spec: str) -> tuple[str | None, str]:
    """``schema.name`` or ``name`` (split at the first dot)."""
    schema, dot, name = text.partition(".")
    if not dot:
        return None, _identifier(text, what, spec)
    return _identifier(schema, f"{what}'s schema", spec), _identifier(name, what, spec)


@dataclass(frozen=True)
class PostgresSpec:
    """A ``postgresql://`` spec, parsed: what the sink writes where, and how it connects."""

    #: The spec without its password: the sink's description (logged, kept in the state).
    description: str
    #: The libpq URI without the sink's own parameters and without a password; the
    #: environment variables in it read.
    conninfo: str = field(repr=False)
    schema: str | None
    table: str
    mode: Literal["append", "merge"]
    keys: tuple[str, ...]
    offsets_schema: str | None
    offsets_table: str
    #: The password given in the spec (``user:PASSWORD@`` or ``password=``), if any.
    password: str | None = field(default=None, repr=False)
    #: How long claiming the stream waits for its offsets row, held by another session.
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT

    @classmethod
    def parse(cls, spec: str) -> PostgresSpec:
        parts = urlsplit(spec)
        if parts.scheme.lower() not in SCHEMES:
            raise InvalidArgumentError(f"sink {spec!r} is not a postgresql:// URI")
        userinfo, at, hostport = parts.netloc.rpartition("@")
        user, colon, raw_password = userinfo.partition(":")
        password = unquote(raw_password) if colon else None
        netloc = f"{user}@{hostport}" if at else hostport
        query = parse_qsl(parts.query, keep_blank_values=True)
        own = {k: v for k, v in query if k in _OWN}
        passed = [(k, v) for k, v in query if k not in _OWN and k != "password"]
        password = next((v for k, v in query if k == "password"), password)
        # The description: as given, without the password.
        public = [(k, v) for k, v in query if k != "password"]
        description = urlunsplit(
            (parts.scheme, netloc, parts.path, urlencode(public, safe="/,:"), parts.fragment)
        )
        for key in _OWN:
            if sum(k == key for k, _ in query) > 1:
                raise InvalidArgumentError(f"sink {description}: {key!r} is given twice")
        if not own.get("table"):
            raise InvalidArgumentError(
                f"sink {description}: needs the target table: ?table=NAME (or schema.name)"
            )
        schema, table = _qualified(own["table"], "table", description)
        mode = own.get("mode", "append")
        if mode not in ("append", "merge"):
            raise InvalidArgumentError(
                f"sink {description}: mode must be 'append' or 'merge', not {mode!r}"
            )
        keys = tuple(k.strip() for k in own.get("key", "").split(",") if k.strip())
        if mode == "merge" and not keys:
            raise InvalidArgumentError(
                f"sink {description}: mode=merge needs the key columns: &key=COLUMN[,...]"
            )
        if mode == "append" and keys:
            raise InvalidArgumentError(
                f"sink {description}: key= is for mode=merge (append mode appends every change)"
            )
        if len(set(keys)) != len(keys):
            raise InvalidArgumentError(f"sink {description}: a key column is named twice")
        for k in keys:
            _identifier(k, "key column", description)
        offsets_schema, offsets_table = _qualified(
            own.get("offsets_table", DEFAULT_OFFSETS_TABLE), "offsets_table", description
        )
        what = f"sink {description}"
        conninfo = urlunsplit(
            (
                parts.scheme,
                expand_env(netloc, what),
                expand_env(parts.path, what),
                urlencode([(k, expand_env(v, what)) for k, v in passed], quote_via=quote),
                "",
            )
        )
        if password is not None:
            password = expand_env(password, f"{what}: the password")
        lock_timeout = DEFAULT_LOCK_TIMEOUT
        if "lock_timeout" in own:
            try:
                lock_timeout = float(own["lock_timeout"])
            except ValueError:
                lock_timeout = -1.0
            if not 0 < lock_timeout < 86_400:
                raise InvalidArgumentError(
                    f"sink {description}: lock_timeout must be a number of seconds above 0, "
                    f"not {own['lock_timeout']!r}"
                )
        return cls(
            description=description,
            conninfo=conninfo,
            schema=schema,
            table=table,
            mode=mode,  # type: ignore[arg-type]  # checked above
            keys=keys,
            offsets_schema=offsets_schema,
            offsets_table=offsets_table,
            password=password,
            lock_timeout=lock_timeout,
        )


def required_grants(
    mode: str, offsets_exist: bool, target_exists: bool
) -> list[tuple[str, str, str]]:
    """The privileges a sink's role needs, as ``(kind, object, privilege)`` with kind
    ``table``, ``schema`` or ``database`` and object ``offsets`` or ``target`` (the schema
    of either) or ``database``: on the offsets table ``SELECT, INSERT, UPDATE`` (or
    ``CREATE`` on its schema to make it); on the target ``SELECT, INSERT`` in append mode and
    ``SELECT, INSERT, UPDATE, DELETE`` in merge mode (or ``CREATE`` on its schema); and in
    merge mode ``TEMPORARY`` on the database (each session loads a delivery into a temporary
    table). A reset also needs ``DELETE`` on the offsets table and ``TRUNCATE`` on the
    target, checked by PostgreSQL when it runs."""
    needed: list[tuple[str, str, str]] = []
    if offsets_exist:
        needed += [("table", "offsets", p) for p in ("SELECT", "INSERT", "UPDATE")]
    else:
        needed.append(("schema", "offsets", "CREATE"))
    if target_exists:
        privileges = ("SELECT", "INSERT") if mode == "append" else MERGE_PRIVILEGES
        needed += [("table", "target", p) for p in privileges]
    else:
        needed.append(("schema", "target", "CREATE"))
    if mode == "merge":
        needed.append(("database", "database", "TEMPORARY"))
    return needed


MERGE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")


def _csv(rows: pa.Table, doubles: frozenset[str] = frozenset()) -> bytes:
    """The rows as CSV; the columns named in ``doubles`` (``float`` values bound for
    ``double precision`` columns) as doubles first, so that their text is the double with
    the float's value (``0.10000000149011612``), not the float's shortest (``0.1``), which
    PostgreSQL would read as another double."""
    for name in doubles:
        i = rows.schema.get_field_index(name)
        rows = rows.set_column(i, name, pc.cast(rows.column(i), pa.float64()))
    out = io.BytesIO()
    pcsv.write_csv(csv_ready(rows), out, pcsv.WriteOptions(include_header=False))
    return out.getvalue()


def _quoted(name: str) -> str:
    """``name`` as a quoted SQL identifier, for the statements an error suggests."""
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class _Column:
    """A column of the target, as the catalog has it."""

    #: Its type, as ``format_type`` spells it.
    type: str
    not_null: bool
    #: Whether an insert that leaves it out gives it a value: a default, an identity or a
    #: generated column.
    filled: bool


@dataclass(frozen=True)
class _Target:
    """The target table, as the catalog has it."""

    oid: int
    #: Whether the sink made it (its comment says so: :data:`CREATED_COMMENT`).
    created: bool
    columns: Mapping[str, _Column]

    def signature(self) -> tuple[Any, ...]:
        return (self.oid, self.created, tuple(self.columns.items()))


# ------------------------------------------------------------------ the sink


@dataclass(frozen=True)
class _Held:
    """The target's row in the offsets table."""

    stream: str
    table_id: str | None
    position: Position | None
    #: The epoch of the last process that claimed the stream or committed its rows.
    epoch: int = 0


class PostgresSink(Sink):
    """Writes change rows to a PostgreSQL table (see the module docstring), exactly once.

    ``max_attempts`` (``None``: forever), ``base_delay`` and ``max_delay``: the retries of
    a connection lost, refused or reset, a serialization failure or a deadlock.
    """

    guarantee: Guarantee = "exactly-once"
    #: Each delivery is one commit, whose fixed cost dominates small deliveries.
    rows_per_delivery = COMMIT_ROWS_PER_DELIVERY

    def __init__(
        self,
        spec: str,
        *,
        max_attempts: int | None = None,
        base_delay: float = 0.5,
        max_delay: float = 60.0,
    ) -> None:
        self.spec = PostgresSpec.parse(spec)
        if self.spec.mode == "merge":
            self.change_order = "removals-first"
            self.row_ids = ROW_ID in self.spec.keys
        require_driver(self.spec.description)
        _check_retry_options(max_attempts, base_delay, max_delay)
        self._policy = RetryPolicy(
            max_attempts=sys.maxsize if max_attempts is None else max_attempts,
            base_delay=base_delay,
            max_delay=max_delay,
        )
        # libpq's defaults, unless the spec sets them: no connection attempt hangs for ever
        # (libpq's own default), and the sessions say whose they are in pg_stat_activity.
        given = {k for k, _ in parse_qsl(urlsplit(self.spec.conninfo).query)}
        self._connect_options: dict[str, Any] = {
            k: v
            for k, v in (("connect_timeout", 10), ("application_name", "deltastream"))
            if k not in given
        }
        self._conn: psycopg.AsyncConnection[Any] | None = None
        #: The target and the source's columns it was last checked (and made to fit) for,
        #: on this connection: a delivery finding both as they were skips the checks.
        self._ready: tuple[Any, ...] | None = None
        #: Source columns of ``float`` values bound for ``double precision`` columns.
        self._doubles: frozenset[str] = frozenset()
        #: The columns and types of this connection's loading table (merge mode).
        self._load_columns: tuple[Any, ...] | None = None
        #: The longest name PostgreSQL keeps (``max_identifier_length``), and the database.
        self._max_name = 63
        self._database = ""
        self._stream: str | None = None
        self._stream_ref: StreamRef | None = None
        #: Whether the target held rows after the last delivery (or when the stream was
        #: recovered): a target found empty at the next one was emptied meanwhile.
        self._holds_rows = False
        #: The source's columns as the last delivery (or the stream's state) had them: a
        #: target column among them that the source lacks now is gone from the source; any
        #: other was added by the target's owner.
        self._source_columns: frozenset[str] = frozenset()
        #: The target, schema-qualified (the schema resolved on connecting).
        self._schema: str | None = self.spec.schema
        self._offsets_schema: str | None = self.spec.offsets_schema
        #: Retries made, for tests.
        self.retries = 0

    # -------------------------------------------------------------- naming

    @property
    def description(self) -> str:
        return self.spec.description

    def __repr__(self) -> str:
        return f"PostgresSink({self.description!r})"

    @property
    def target(self) -> str:
        """The target table as ``schema.name`` (the schema once resolved)."""
        return f"{self._schema}.{self.spec.table}" if self._schema else self.spec.table

    @property
    def offsets_name(self) -> str:
        s = self._offsets_schema
        return f"{s}.{self.spec.offsets_table}" if s else self.spec.offsets_table

    def output_claim(self, stream: str) -> str | None:
        parts = urlsplit(self.spec.conninfo)
        where = f"{parts.netloc.rpartition('@')[2]}{parts.path}?{parts.query}"
        return f"postgresql:{where}#{self.spec.schema or ''}.{self.spec.table}"

    def _target_sql(self) -> sql.Identifier:
        from psycopg import sql

        assert self._schema is not None
        return sql.Identifier(self._schema, self.spec.table)

    def _offsets_sql(self) -> sql.Identifier:
        from psycopg import sql

        assert self._offsets_schema is not None
        return sql.Identifier(self._offsets_schema, self.spec.offsets_table)

    # -------------------------------------------------------------- connections

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        import psycopg

        if self._conn is None or self._conn.closed:
            options = dict(self._connect_options)
            if self.spec.password is not None:
                options["password"] = self.spec.password
            # Text is UTF-8 both ways, whatever the spec, the environment (PGCLIENTENCODING)
            # or the role's settings say: PostgreSQL converts it to the database's encoding.
            options["client_encoding"] = "UTF8"
            conn = await psycopg.AsyncConnection.connect(self.spec.conninfo, **options)
            try:
                self._check_encoding(conn)
                cur = await conn.execute(
                    "SELECT current_schema(), current_setting('max_identifier_length')::int"
                )
                row = await cur.fetchone()
                await conn.rollback()
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await conn.close()
                raise
            assert row is not None
            self._conn, self._max_name = conn, row[1]
            if self._schema is None or self._offsets_schema is None:
                if row[0] is None:
                    raise SinkSchemaError(
                        self.description,
                        "no schema to create tables in (the search_path names none that "
                        "exists): name one, ?table=schema.name",
                    )
                self._schema = self._schema or row[0]
                self._offsets_schema = self._offsets_schema or row[0]
        return self._conn

    def _check_encoding(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Refuse a database whose encoding cannot hold every Unicode character (only UTF8
        can): its text would be stored changed, or not at all."""
        self._database = conn.info.dbname
        encoding = conn.info.parameter_status("server_encoding")
        if encoding != "UTF8":
            raise SinkRejectedError(
                self.description,
                f"the database {self._database!r} has encoding {encoding}, which cannot hold "
                "every Unicode character: deltastream writes text exactly, into a UTF8 "
                "database only (CREATE DATABASE … ENCODING 'UTF8' TEMPLATE template0); "
                "nothing was written",
            )

    async def _discard(self) -> None:
        conn, self._conn = self._conn, None
        # What was made or checked on it goes with it.
        self._ready, self._load_columns = None, None
        if conn is not None:
            with anyio.CancelScope(shield=True):
                await conn.close()

    async def _run(
        self,
        operation: str,
        what: str,
        work: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]],
    ) -> T:
        """``work(connection)``, retried on transient failures (on a new connection); any
        other failure raised as a :mod:`deltastream.errors` error naming the target."""
        import psycopg

        async def attempt() -> T:
            conn = await self._connection()
            try:
                return await work(conn)
            except BaseException:
                # Whatever state the connection is in (a transaction failed, a COPY half
                # sent, cancelled), the next attempt starts on a new one.
                await self._discard()
                raise

        def counted() -> None:
            self.retries += 1

        try:
            return await call_with_retries(
                attempt,
                operation=operation,
                target=self.description,
                policy=self._policy,
                transient=transient_cause,
                listener=self.retry_listener,
                on_retry=counted,
                logger=log,
            )
        except StorageError as e:  # the retries ran out
            raise SinkError(self.description, e.problem) from e
        except psycopg.Error as e:
            raise permanent_error(self.description, e, what) from e

    # -------------------------------------------------------------- recover

    async def recover(
        self, stream: StreamRef, committed: Position | None, state: Mapping[str, Any]
    ) -> HeldPosition | None:
        """Claim the target for ``stream`` (creating the offsets table if missing) and
        return the position its offsets row holds."""
        self._stream, self._stream_ref = stream.name, stream
        columns = state.get("columns")
        self._source_columns = frozenset(
            c for c in (columns if isinstance(columns, list) else []) if isinstance(c, str)
        )

        async def work(conn: psycopg.AsyncConnection[Any]) -> HeldPosition | None:
            async with conn.transaction():
                await self._check_grants(conn)
                await self._create_offsets_table(conn)
                held = await self._claimed_row(conn)
                inserted = None
                if held is not None and held.stream != stream.name:
                    raise self._in_use(held.stream)
                if held is None:
                    rows = await self._target_has_rows(conn)
                    if rows:
                        raise SinkRecoveryError(
                            self.description,
                            f"the target table {self.target} holds rows that no stream's row "
                            f"in {self.offsets_name} accounts for; deltastream writes only to "
                            "a new or empty table it owns: name another table, or empty this "
                            "one",
                        )
                    # Another process claiming the new target at the same time inserts its
                    # row first, or this one does (with its epoch): the row read again says
                    # whose it is, and a process of the same stream takes the next epoch.
                    cur = await conn.execute(
                        self._sql(
                            "INSERT INTO {} (stream, target, epoch) VALUES (%s, %s, %s) "
                            "ON CONFLICT (target) DO NOTHING RETURNING epoch"
                        ),
                        [stream.name, self.target, max(stream.epoch, 1)],
                    )
                    inserted = await cur.fetchone()
                    held = await self._claimed_row(conn)
                    if held is not None and held.stream != stream.name:
                        raise self._in_use(held.stream)
                    if inserted is not None:
                        self.epoch = int(inserted[0])
                if inserted is None:
                    await self._claim(conn, stream, 0 if held is None else held.epoch)
                self._holds_rows = False
                if held is not None and held.position is not None:
                    intact = committed == held.position and bool(state.get("rows"))
                    await self._check_target_intact(conn, stream, held.position, intact)
                    self._holds_rows = await self._target_has_rows(conn)
                delivered = bool(state.get("target"))
                if delivered and (held is None or held.position is None):
                    raise SinkRecoveryError(
                        self.description,
                        f"the target table {self.target} holds none of stream "
                        f"{stream.name!r}'s rows, but the stream's state says it delivered "
                        f"them up to {committed}: the database was restored from before the "
                        "stream's first delivery, or the stream's row in "
                        f"{self.offsets_name} was removed; {_reset_hint(stream, self.description)}",
                    )
            if held is None or held.position is None or held.table_id is None:
                return None
            return HeldPosition(held.position, held.table_id)

        return await self._run("connect", "recovery", work)

    async def _check_grants(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Refuse, in one line naming the grant, a role that lacks a privilege the sink
        needs (:func:`required_grants`): checked before anything is written, so that a
        missing grant does not surface halfway through a delivery."""
        offsets = self._offsets_sql().as_string(conn)
        target = self._target_sql().as_string(conn)
        cur = await conn.execute(
            "SELECT current_user, to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
            [offsets, target],
        )
        row = await cur.fetchone()
        assert row is not None
        role, offsets_exist, target_exists = row
        needed = required_grants(self.spec.mode, offsets_exist, target_exists)
        for kind, name, privilege in needed:
            shown = self.offsets_name if name == "offsets" else self.target
            if kind == "table":
                obj = offsets if name == "offsets" else target
                query = "SELECT has_table_privilege(%s, %s)"
            elif kind == "schema":
                obj = shown = (self._offsets_schema if name == "offsets" else self._schema) or ""
                query = "SELECT has_schema_privilege(%s, %s)"
            else:
                cur = await conn.execute("SELECT current_database()")
                found = await cur.fetchone()
                obj = shown = found[0] if found else ""
                query = "SELECT has_database_privilege(%s, %s)"
            cur = await conn.execute(query, [obj, privilege])
            ok = await cur.fetchone()
            if ok is not None and not ok[0]:
                raise SinkRejectedError(
                    self.description,
                    f"role {role!r} lacks {privilege} on {kind} {shown}, which the sink needs "
                    f"(GRANT {privilege} ON {'' if kind == 'table' else kind.upper() + ' '}"
                    f"{shown} TO {role}); nothing was written",
                )

    async def _claimed_row(self, conn: psycopg.AsyncConnection[Any]) -> _Held | None:
        """The stream's offsets row, locked; waiting at most the spec's ``lock_timeout``
        for a session that holds it (a process writing the stream, perhaps frozen)."""
        import psycopg

        await conn.execute(f"SET LOCAL lock_timeout = '{int(self.spec.lock_timeout * 1000)}ms'")
        try:
            async with conn.transaction():  # a savepoint, so that the error can be reported
                return await self._held(conn, lock=True)
        except psycopg.errors.LockNotAvailable as e:
            raise SinkInUseError(
                self.description,
                f"the row of target {self.target} in {self.offsets_name} stayed locked by "
                f"another session for {self.spec.lock_timeout:g}s (lock_timeout): a process "
                "writing this stream, perhaps frozen (pg_stat_activity shows its session); "
                "the stream was not claimed",
            ) from e

    async def _claim(
        self, conn: psycopg.AsyncConnection[Any], stream: StreamRef, held: int
    ) -> None:
        """Choose the epoch of this sink's commits: above the offsets row's, and at least the
        one the stream claimed through its state, so that the process that starts last takes
        the stream over. A stream claimed through its state records it in the row now (the
        row is locked meanwhile), so that an older process commits nothing more; a new
        stream's is recorded with its first delivery."""
        self.epoch = max(stream.epoch, held + 1)
        if stream.epoch:
            await conn.execute(
                self._sql("UPDATE {} SET epoch = %s WHERE target = %s"),
                [self.epoch, self.target],
            )

    def _fenced(self, epoch: int, when: str) -> SinkFencedError:
        where = f"the row of target {self.target} in {self.offsets_name}"
        return _fenced(self.description, self._stream, where, epoch, self.epoch, when)

    async def _check_target_intact(
        self,
        conn: psycopg.AsyncConnection[Any],
        stream: StreamRef,
        position: Position,
        held_rows: bool,
    ) -> None:
        """A target dropped while its offsets row says rows were delivered into it is not
        made anew (it would hold only the rows from the position on); nor is one emptied
        (``held_rows``: the stream's state, at the row's position, says the target held rows
        after its last delivery)."""
        if not await self._columns(conn):
            raise self._not_intact(stream, position, dropped=True)
        if held_rows and not await self._target_has_rows(conn):
            raise self._not_intact(stream, position, dropped=False)

    def _not_intact(
        self, stream: StreamRef, position: Position, dropped: bool
    ) -> SinkRecoveryError:
        how = "does not exist" if dropped else "holds no rows"
        return SinkRecoveryError(
            self.description,
            f"the target table {self.target} {how}, but the stream's row in "
            f"{self.offsets_name} says its rows up to {position} were delivered into it: it "
            f"was {'dropped' if dropped else 'emptied'} outside deltastream; "
            "nothing was touched. " + _reset_hint(stream, self.description),
        )

    def _in_use(self, owner: str) -> SinkInUseError:
        return SinkInUseError(
            self.description,
            f"the target table {self.target} belongs to stream {owner!r} (its row in "
            f"{self.offsets_name}), not to {self._stream!r}; each stream needs its own target "
            "table",
        )

    def _sql(self, template: str, *args: Any) -> sql.Composed:
        """``template`` with the offsets table for its first ``{}`` and ``args`` after."""
        from psycopg import sql

        return sql.SQL(template).format(self._offsets_sql(), *args)

    async def _create_offsets_table(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Create the offsets table if it does not exist, and add the ``epoch`` column to
        one made before epochs were kept. An existing table that fits is used as it is, so
        a role with only ``SELECT, INSERT, UPDATE`` on it needs no ``CREATE``."""
        existing = await self._offsets_columns(conn)
        if existing and "epoch" in existing:
            return
        # Two streams starting at once must not both create it (CREATE TABLE IF NOT EXISTS
        # is not safe against that): a lock for the offsets table's name serialises them.
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [self.offsets_name])
        await conn.execute(
            self._sql(
                """CREATE TABLE IF NOT EXISTS {} (
                    stream text NOT NULL,
                    target text PRIMARY KEY,
                    table_id text,
                    version bigint,
                    snapshot boolean,
                    "offset" bigint,
                    epoch bigint,
                    updated_at timestamptz NOT NULL DEFAULT now()
                )"""
            )
        )
        await conn.execute(self._sql("ALTER TABLE {} ADD COLUMN IF NOT EXISTS epoch bigint"))

    async def _offsets_columns(self, conn: psycopg.AsyncConnection[Any]) -> set[str]:
        cur = await conn.execute(
            """SELECT a.attname FROM pg_attribute a
               WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped""",
            [self._offsets_sql().as_string(conn)],
        )
        return {row[0] for row in await cur.fetchall()}

    async def _held(self, conn: psycopg.AsyncConnection[Any], *, lock: bool) -> _Held | None:
        query = (
            'SELECT stream, table_id, version, snapshot, "offset", epoch FROM {} WHERE target = %s'
        )
        cur = await conn.execute(self._sql(query + (" FOR UPDATE" if lock else "")), [self.target])
        row = await cur.fetchone()
        if row is None:
            return None
        stream, table_id, version, snapshot, offset, epoch = row
        position = None if version is None else Position(version, bool(snapshot), offset or 0)
        return _Held(stream, table_id, position, epoch or 0)

    async def _target_has_rows(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        if not await self._columns(conn):
            return False
        return await self._has_rows(conn)

    async def _has_rows(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Whether the target (which exists) holds a row."""
        from psycopg import sql

        cur = await conn.execute(
            sql.SQL("SELECT EXISTS (SELECT FROM {})").format(self._target_sql())
        )
        row = await cur.fetchone()
        return bool(row and row[0])

    async def _columns(self, conn: psycopg.AsyncConnection[Any]) -> dict[str, str]:
        """The target's columns and their types (empty: no such table)."""
        target = await self._target_info(conn)
        return {} if target is None else {n: c.type for n, c in target.columns.items()}

    async def _target_info(self, conn: psycopg.AsyncConnection[Any]) -> _Target | None:
        """The target as the catalog has it (``None``: no such table), in one query."""
        cur = await conn.execute(
            """SELECT c.oid::bigint, obj_description(c.oid, 'pg_class'), a.attname,
                      format_type(a.atttypid, a.atttypmod), a.attnotnull,
                      a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> ''
               FROM pg_class c
               LEFT JOIN pg_attribute a
                 ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
               WHERE c.oid = to_regclass(%s)
               ORDER BY a.attnum""",
            [self._target_sql().as_string(conn)],
        )
        found = await cur.fetchall()
        if not found:
            return None
        oid, comment = found[0][:2]
        columns = {
            name: _Column(kind, not_null, filled)
            for _, _, name, kind, not_null, filled in found
            if name is not None
        }
        created = (comment or "").startswith(CREATED_COMMENT)
        return _Target(oid, created, columns)

    # -------------------------------------------------------------- deliver

    async def deliver(self, delivery: Delivery) -> Mapping[str, Any]:
        if self._stream is None:
            raise SinkError(self.description, "deliver() before recover()")
        columns = self._wanted_columns(delivery.schema)
        if self.spec.mode == "merge":
            self._check_keys(delivery)
        data = await self._rows(delivery)
        what = f"{delivery.num_rows:,} rows ({delivery.start} to {delivery.end})"
        source = tuple((f.name, str(f.type)) for f in delivery.schema)

        async def work(conn: psycopg.AsyncConnection[Any]) -> None:
            async with conn.transaction():
                held = await self._held(conn, lock=True)
                if (
                    held is not None
                    and held.position == delivery.end
                    and held.stream == self._stream
                    and held.table_id == delivery.table_id
                    and held.epoch == self.epoch
                ):
                    # A retry of a delivery whose COMMIT went through while the connection
                    # was lost: it is delivered.
                    self._holds_rows = await self._target_has_rows(conn)
                    self._source_columns = frozenset(n for n, _ in columns)
                    return
                self._check_position(held, delivery)
                assert held is not None and self._stream_ref is not None
                # The target as it is now (one catalog query): dropped, emptied or replaced
                # since the last delivery, or changed by its owner, it is checked again.
                target = await self._target_info(conn)
                if held.position is not None:
                    if target is None:
                        raise self._not_intact(self._stream_ref, held.position, dropped=True)
                    if self._holds_rows and not await self._has_rows(conn):
                        raise self._not_intact(self._stream_ref, held.position, dropped=False)
                doubles = self._doubles
                if target is None or self._ready != (target.signature(), source):
                    target = await self._fit_target(conn, target, columns, delivery.schema)
                    doubles = self._doubles_of(target, delivery.schema)
                if data is not None:
                    await self._load(conn, columns, data, target, doubles)
                await conn.execute(
                    self._sql(
                        'UPDATE {} SET table_id = %s, version = %s, snapshot = %s, "offset" = %s, '
                        "epoch = %s, updated_at = now() WHERE target = %s"
                    ),
                    [
                        delivery.table_id,
                        delivery.end.version,
                        delivery.end.snapshot,
                        delivery.end.offset,
                        self.epoch,
                        self.target,
                    ],
                )
                holds = await self._has_rows(conn)
                crash_point("sink.after-write")
            crash_point("sink.after-fsync")
            self._ready, self._doubles = (target.signature(), source), doubles
            self._holds_rows = holds
            self._source_columns = frozenset(n for n, _ in columns)

        await self._run("COPY", what, work)
        # Whether the target held rows after it: a restart refuses a target emptied since.
        # The source's columns: a restart tells a column gone from the source from one the
        # target's owner added.
        return {
            "target": self.target,
            "rows": self._holds_rows,
            "columns": sorted(self._source_columns),
        }

    @staticmethod
    def _doubles_of(target: _Target, schema: pa.Schema) -> frozenset[str]:
        """The source's ``float`` columns whose target column is ``double precision``."""
        return frozenset(
            f.name
            for f in schema
            if pa.types.is_float32(f.type)
            and f.name in target.columns
            and target.columns[f.name].type == "double precision"
        )

    def _check_position(self, held: _Held | None, delivery: Delivery) -> None:
        if held is None:
            raise SinkRecoveryError(
                self.description,
                f"the stream's row in {self.offsets_name} for {self.target} was removed while "
                "the stream was running (a reset from elsewhere?); stopping",
            )
        if held.stream != self._stream:
            raise self._in_use(held.stream)
        if held.epoch > self.epoch:
            raise self._fenced(held.epoch, "")
        if held.position is not None and held.position != delivery.start:
            if held.epoch < self.epoch:
                # An older process delivered after this one claimed the stream, before the
                # claim reached the row (a new stream records it with its first delivery):
                # it loses at its state's next commit; this one resumes where the row is.
                raise SinkError(
                    self.description,
                    f"an older process of stream {self._stream!r} (epoch {held.epoch}, this "
                    f"one's {self.epoch}) delivered its rows up to {held.position} into "
                    f"{self.target} after this one took the stream over; nothing was "
                    "committed, and the stream restarts from the database's position",
                )
            raise SinkFencedError(
                self.description,
                f"the target table {self.target} holds stream {self._stream!r}'s rows up to "
                f"{held.position}, but this delivery starts at {delivery.start}: another "
                f"process of the stream wrote its rows (epoch {held.epoch}, this process's "
                f"{self.epoch}); nothing was committed, and this process gives the stream up",
                self.epoch,
            )

    def _wanted_columns(self, schema: pa.Schema) -> list[tuple[str, str]]:
        """The target's columns for rows of ``schema``, with their mapped types."""
        fields = [f for f in schema if self.spec.mode == "append" or f.name not in CDF_COLUMNS]
        try:
            return [(f.name, pg_type(f.type)) for f in fields]
        except InvalidArgumentError as e:
            raise SinkSchemaError(self.description, str(e)) from None

    def _check_keys(self, delivery: Delivery) -> None:
        names = delivery.schema.names
        missing = [k for k in self.spec.keys if k not in names]
        if missing:
            raise SinkSchemaError(
                self.description,
                f"the key column(s) {missing} are not columns of the source "
                f"({', '.join(n for n in names if n not in CDF_COLUMNS)})",
            )
        for batch in delivery.batches:
            for key in self.spec.keys:
                column = batch.column(names.index(key))
                if column.null_count:
                    row = pc.index(pc.is_null(column), True).as_py()
                    version = batch.column(names.index("_commit_version"))[row].as_py()
                    raise SinkRejectedError(
                        self.description,
                        f"a change row of version {version} has a null key {key!r} "
                        f"({column.null_count} in its batch); merge mode needs every key; "
                        "nothing of the delivery was committed",
                    )

    async def _rows(self, delivery: Delivery) -> pa.Table | None:
        """The delivery's rows in the column order of :meth:`_load` (``None``: none); in
        merge mode, one row per key (:func:`~deltastream.daemon.sinks.mirror.mirror_changes`,
        worked out in a worker thread)."""
        if not delivery.num_rows:
            return None
        table = pa.Table.from_batches(
            [b for b in delivery.batches if b.num_rows], schema=delivery.schema
        )
        if self.spec.mode == "merge":
            return await anyio.to_thread.run_sync(
                mirror_changes, table, self.spec.keys, self.description
            )
        return table

    def _check_names(self, wanted: Sequence[tuple[str, str]]) -> None:
        """Refuse a source column whose name PostgreSQL would not keep as it is (longer than
        ``max_identifier_length``: cut), in one line naming it."""
        for name, _ in wanted:
            size = len(name.encode())
            if size > self._max_name or "\0" in name:
                cut = name.encode()[: self._max_name].decode(errors="ignore")
                raise SinkSchemaError(
                    self.description,
                    f"the source's column {name!r} is {size} bytes long: PostgreSQL keeps "
                    f"names of at most {self._max_name} bytes (max_identifier_length) and "
                    f"would cut it to {cut!r}; deltastream writes each column under the "
                    "source's name exactly (rename the column in the source)",
                )

    async def _fit_target(
        self,
        conn: psycopg.AsyncConnection[Any],
        target: _Target | None,
        wanted: Sequence[tuple[str, str]],
        schema: pa.Schema,
    ) -> _Target:
        """Create the target, or check that it holds every value of the source's columns
        (:func:`~deltastream.daemon.sinks.exact.fit`) and make it: add the columns new in
        the source, and widen those the source widened in a target the sink made. A target
        that does not fit is refused before anything is changed. The target, as it is
        now."""
        from psycopg import sql

        self._check_names(wanted)
        fields = {f.name: f.type for f in schema}
        if target is None:
            for name, kind in wanted:
                holds = capacity(kind)
                if holds is None or not fit(fields[name], holds, name).holds:
                    raise SinkSchemaError(
                        self.description,
                        f"no PostgreSQL type holds every value of the source's column {name!r} "
                        f"({type_name(fields[name])})",
                    )
            keys = self.spec.keys
            parts = [sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t)) for n, t in wanted]
            if keys:
                key_list = sql.SQL(", ").join(map(sql.Identifier, keys))
                parts.append(sql.SQL("PRIMARY KEY ({})").format(key_list))
            columns = sql.SQL(", ").join(parts)
            await conn.execute(sql.SQL("CREATE TABLE {} ({})").format(self._target_sql(), columns))
            comment = f"{CREATED_COMMENT} for stream {self._stream!r}; it follows the source"
            await conn.execute(
                sql.SQL("COMMENT ON TABLE {} IS {}").format(
                    self._target_sql(), sql.Literal(comment)
                )
            )
            log.info("%s: created the target table %s", self.description, self.target)
            made = await self._target_info(conn)
            assert made is not None
            return made
        problems, widen, add, extra = self._compare(target, wanted, fields)
        if problems:
            source = ", ".join(f"{n} {t}" for n, t in wanted)
            existing = ", ".join(f"{n} {c.type}" for n, c in target.columns.items())
            assert self._stream_ref is not None
            raise SinkSchemaError(
                self.description,
                f"the target table {self.target} does not fit the source's rows: "
                f"{'; '.join(problems)} (source: {source}; target: {existing}); nothing was "
                f"committed. {_reset_hint(self._stream_ref, self.description)}",
            )
        keys = self.spec.keys
        if keys and not await self._has_unique_index(conn, keys):
            raise SinkSchemaError(
                self.description,
                f"the target table {self.target} has no primary key or unique index on exactly "
                f"the key column(s) {', '.join(keys)}, which merge mode needs",
            )
        for name in extra:
            log.info(
                "%s: column %s of %s is not the source's: left to its default",
                self.description,
                name,
                self.target,
            )
        if widen:
            # One statement: the table is rewritten once, in the delivery's transaction.
            await conn.execute(
                sql.SQL("ALTER TABLE {} {}").format(
                    self._target_sql(),
                    sql.SQL(", ").join(
                        sql.SQL("ALTER COLUMN {} TYPE {}").format(sql.Identifier(n), sql.SQL(t))
                        for n, _, t in widen
                    ),
                )
            )
            for name, old, new in widen:
                log.info(
                    "%s: widened column %s of %s from %s to %s (the source widened it)",
                    self.description,
                    name,
                    self.target,
                    old,
                    new,
                )
        for name, kind in add:
            await conn.execute(
                sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(
                    self._target_sql(), sql.Identifier(name), sql.SQL(kind)
                )
            )
            log.info(
                "%s: added column %s %s to %s (new in the source)",
                self.description,
                name,
                kind,
                self.target,
            )
        if not (widen or add):
            return target
        changed = await self._target_info(conn)
        assert changed is not None
        return changed

    def _compare(
        self,
        target: _Target,
        wanted: Sequence[tuple[str, str]],
        fields: Mapping[str, pa.DataType],
    ) -> tuple[list[str], list[tuple[str, str, str]], list[tuple[str, str]], list[str]]:
        """What stops the target from holding the source's rows (each with the statement
        that fixes it), the columns to widen ``(name, old type, new type)``, the columns to
        add ``(name, type)`` and the target's columns that are not the source's (accepted:
        each takes its default)."""
        table = f"{_quoted(self._schema or '')}.{_quoted(self.spec.table)}"
        problems: list[str] = []
        widen: list[tuple[str, str, str]] = []
        add: list[tuple[str, str]] = []
        for name, kind in wanted:
            column = target.columns.get(name)
            if column is None:
                add.append((name, kind))
                continue
            source = fields[name]
            holds = capacity(column.type)
            found = (
                Fit(refused=((name, column.type, type_name(source)),))
                if holds is None
                else fit(source, holds, name)
            )
            if found.holds:
                continue
            if found.widened and not (found.refused or found.added) and target.created:
                widen.append((name, column.type, kind))
                continue
            why = ""
            if found.widened and not found.refused:
                why = " (deltastream widens only a target it made; this one was made beforehand)"
            problems.append(
                f"column {name!r} is {column.type} in the target, which does not hold every "
                f"value of the source's {type_name(source)}: ALTER TABLE {table} ALTER COLUMN "
                f"{_quoted(name)} TYPE {kind} would make it fit{why}"
            )
        names = {n for n, _ in wanted}
        others = [n for n in target.columns if n not in names]
        gone = [n for n in others if n in self._source_columns]
        if len(gone) == 1 and len(add) == 1:
            (old,), ((new, _),) = gone, add
            problems.append(
                f"column {old!r} is gone from the source and {new!r} is new in it: if the "
                f"source renamed it, ALTER TABLE {table} RENAME COLUMN {_quoted(old)} TO "
                f"{_quoted(new)} renames it in the target too"
            )
        else:
            problems += [
                f"column {n!r} is gone from the source: ALTER TABLE {table} DROP COLUMN "
                f"{_quoted(n)} drops it from the target too"
                for n in gone
            ]
        extra: list[str] = []
        for name in others:
            column = target.columns[name]
            if name in gone:
                continue
            if column.not_null and not column.filled:
                problems.append(
                    f"column {name!r}, which the source lacks, is NOT NULL without a default: "
                    f"ALTER TABLE {table} ALTER COLUMN {_quoted(name)} DROP NOT NULL (or SET "
                    "DEFAULT …) lets rows without it in"
                )
            else:
                extra.append(name)
        return problems, widen, add, extra

    async def _has_unique_index(
        self, conn: psycopg.AsyncConnection[Any], keys: Sequence[str]
    ) -> bool:
        cur = await conn.execute(
            """SELECT array_agg(a.attname::text ORDER BY a.attname)
               FROM pg_index i
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
               WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indpred IS NULL
                 AND i.indexprs IS NULL
               GROUP BY i.indexrelid""",
            [self._target_sql().as_string(conn)],
        )
        return any(sorted(row[0]) == sorted(keys) for row in await cur.fetchall())

    async def _load(
        self,
        conn: psycopg.AsyncConnection[Any],
        wanted: Sequence[tuple[str, str]],
        data: pa.Table,
        target: _Target,
        doubles: frozenset[str],
    ) -> None:
        from psycopg import sql

        names = [n for n, _ in wanted]
        if self.spec.mode == "append":
            # Straight into the target: the transaction makes it all or nothing, and
            # PostgreSQL parses each value into the target column's own type.
            await self._copy(conn, self._target_sql(), names, data, doubles)
            return
        load = sql.Identifier(_LOAD)
        cols = sql.SQL(", ").join(map(sql.Identifier, names))
        delete, added_first, version = map(sql.Identifier, FLAGS)
        load_columns = (tuple(names), target.signature())
        if self._load_columns != load_columns:
            # The session's loading table, made once per connection (and again when the
            # target's columns change), with the target's column types; its rows go at
            # commit.
            await conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(load))
            await conn.execute(
                sql.SQL(
                    "CREATE TEMP TABLE {load} ON COMMIT DELETE ROWS AS SELECT {cols}, "
                    "NULL::boolean AS {delete}, NULL::boolean AS {added_first}, "
                    "NULL::bigint AS {version} FROM {target} WITH NO DATA"
                ).format(
                    load=load,
                    cols=cols,
                    delete=delete,
                    added_first=added_first,
                    version=version,
                    target=self._target_sql(),
                )
            )
            self._load_columns = load_columns
        await self._copy(conn, load, [*names, *FLAGS], data, doubles)
        keys = sql.SQL(", ").join(map(sql.Identifier, self.spec.keys))
        match = sql.SQL(" AND ").join(
            sql.SQL("t.{k} = l.{k}").format(k=sql.Identifier(k)) for k in self.spec.keys
        )
        key_values = sql.SQL(", ").join(
            sql.SQL("l.{k}").format(k=sql.Identifier(k)) for k in self.spec.keys
        )
        names_of = {"load": load, "target": self._target_sql(), "match": match, "cols": cols}
        names_of |= {"keys": keys, "key_values": key_values}
        names_of |= {"delete": delete, "added_first": added_first, "version": version}
        # The mirror rule (deltastream.daemon.sinks.mirror): the keys whose last change is
        # a removal are deleted; a key the delivery adds anew must not be there already
        # (found among the deleted ones, or refused by the unique index on insert).
        # Not a prepared statement: its result's types are the key columns', which change
        # when the target's are widened (a prepared one would fail: "cached plan must not
        # change result type").
        cur = await conn.execute(
            sql.SQL(
                "WITH gone AS (DELETE FROM {target} AS t USING {load} AS l"
                " WHERE l.{delete} AND {match} RETURNING {key_values}, l.{added_first},"
                " l.{version}) SELECT * FROM gone WHERE {added_first}"
                " ORDER BY {version} LIMIT 1"
            ).format(**names_of),
            prepare=False,
        )
        self._refuse_duplicate(await cur.fetchone())
        import psycopg

        try:
            async with conn.transaction():  # a savepoint: the lookup below runs after it
                await conn.execute(
                    sql.SQL(
                        "INSERT INTO {target} ({cols}) SELECT {cols} FROM {load}"
                        " WHERE {added_first} AND NOT {delete}"
                    ).format(**names_of)
                )
        except psycopg.errors.UniqueViolation:
            cur = await conn.execute(
                sql.SQL(
                    "SELECT {key_values}, l.{version} FROM {load} AS l JOIN {target} AS t"
                    " ON {match} WHERE l.{added_first} AND NOT l.{delete}"
                    " ORDER BY l.{version} LIMIT 1"
                ).format(**names_of),
                prepare=False,
            )
            self._refuse_duplicate(await cur.fetchone())
            raise  # another unique index of the target refused a row
        others = [n for n in names if n not in self.spec.keys]
        update: sql.Composable
        if others:
            update = sql.SQL("DO UPDATE SET {}").format(
                sql.SQL(", ").join(
                    sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c)) for c in others
                )
            )
        else:
            update = sql.SQL("DO NOTHING")
        await conn.execute(
            sql.SQL(
                "INSERT INTO {target} ({cols}) SELECT {cols} FROM {load}"
                " WHERE NOT {added_first} AND NOT {delete} ON CONFLICT ({keys}) {update}"
            ).format(update=update, **names_of)
        )

    def _refuse_duplicate(self, found: Sequence[Any] | None) -> None:
        """Raise :func:`duplicate_key_error` for a row of the load table found in the
        target (its key values, its added-first flag or not, its version last)."""
        if found is None:
            return
        keys = self.spec.keys
        raise duplicate_key_error(self.description, keys, list(found[: len(keys)]), found[-1])

    @staticmethod
    async def _copy(
        conn: psycopg.AsyncConnection[Any],
        table: sql.Composable,
        names: Sequence[str],
        rows: pa.Table,
        doubles: frozenset[str] = frozenset(),
    ) -> None:
        """``COPY`` the rows into ``table`` as CSV. They are encoded a slice at a time in a
        worker thread while the slice before is sent, so that the encoding overlaps the
        server's parsing (on another core) rather than adding to it."""
        from psycopg import sql

        query = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
            table, sql.SQL(", ").join(map(sql.Identifier, names))
        )
        slices = [rows.slice(i, _COPY_SLICE) for i in range(0, rows.num_rows, _COPY_SLICE)]
        send, receive = anyio.create_memory_object_stream[bytes](1)
        encoding: Exception | None = None
        sending: Exception | None = None

        async def encode() -> None:
            nonlocal encoding
            async with send:
                try:
                    for part in slices:
                        await send.send(await anyio.to_thread.run_sync(_csv, part, doubles))
                except anyio.BrokenResourceError:
                    pass  # the sending side failed: its error is raised
                except Exception as e:
                    encoding = e

        # The failures are raised after the task group, as themselves (not in a group).
        async with conn.cursor() as cur, cur.copy(query) as copy:
            async with anyio.create_task_group() as tg:
                tg.start_soon(encode)
                try:
                    async with receive:
                        async for data in receive:
                            await copy.write(data)
                except Exception as e:
                    sending = e
                    tg.cancel_scope.cancel()
            if sending is not None:
                raise sending
            if encoding is not None:
                raise encoding

    # -------------------------------------------------------------- reset, close

    async def reset(self, stream: StreamRef) -> list[str]:
        """Empty the target table and remove the stream's offsets row, in one transaction
        (only the stream's own: a target of another stream is refused)."""
        self._stream = stream.name

        async def work(conn: psycopg.AsyncConnection[Any]) -> list[str]:
            from psycopg import sql

            async with conn.transaction():
                offsets = self._offsets_sql().as_string(conn)
                cur = await conn.execute("SELECT to_regclass(%s)", [offsets])
                row = await cur.fetchone()
                if row is None or row[0] is None:
                    return []
                held = await self._held(conn, lock=True)
                if held is None:
                    return []
                if held.stream != stream.name:
                    raise self._in_use(held.stream)
                removed = [f"the stream's row in {self.offsets_name}"]
                if await self._columns(conn):
                    await conn.execute(sql.SQL("TRUNCATE {}").format(self._target_sql()))
                    removed.insert(0, f"the rows of {self.target}")
                await conn.execute(self._sql("DELETE FROM {} WHERE target = %s"), [self.target])
            crash_point("reset.output-file")
            return removed

        return await self._run("reset", "the reset", work)

    async def aclose(self) -> None:
        await self._discard()
