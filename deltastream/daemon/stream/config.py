"""A stream's settings, defined once: :class:`TailConfig` and the options users give.

Each field of :class:`TailConfig` states its type, default and constraints in one place, its
annotation; a field users set (everything but the stream's identity and a few tuning knobs)
also carries an :class:`Option`: its ``tail`` flag, help text and, where it differs from the
field's name, its TOML key. From that definition come the ``deltastream tail`` options
(:func:`add_cli_options`, :func:`cli_options`), the keys of a ``serve`` file's ``[[tables]]``
and ``[defaults]`` (:data:`OPTIONS`, :func:`convert_options`) and the keywords of
:func:`deltastream.tail` (:class:`TailOptions`, :func:`tail_config`).

Values are checked strictly, by pydantic in strict mode, whichever way they come: a string
is no boolean (``"false"`` is not false), a float no count (``1.9`` is not 1), ``true`` no
number, NaN and infinity no seconds, and out-of-range values are refused; a size in bytes
is a number or text with a unit (``128m``, the rule of :mod:`deltastream.sizes`). Every error is an
:class:`~deltastream.errors.InvalidArgumentError` naming the key as the user spelled it (the
Python keyword, the TOML key or the CLI flag) and the value given (except for settings that
hold credentials, marked :class:`Secret`: the http sink's headers); callers add where it was
given (a file, a ``[[tables]]`` entry), once.
"""

from __future__ import annotations

import argparse
import datetime as dt
import enum
import functools
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Annotated, Any, Final, TypedDict, TypeVar, get_args, get_type_hints

from pydantic import BeforeValidator, Field, TypeAdapter, ValidationError

from deltastream.daemon.delivery import (
    COMMIT_ROWS_PER_DELIVERY,
    ROWS_PER_DELIVERY,
    STREAM_NAME,
    Sink,
)
from deltastream.daemon.sinks.exec import EXEC_TIMEOUT
from deltastream.daemon.sinks.http import HTTP_TIMEOUT, resolve_http_headers
from deltastream.daemon.stream.watcher import DEFAULT_SAFETY_POLL_INTERVAL
from deltastream.errors import InvalidArgumentError
from deltastream.sizes import parse_size
from deltastream.snapshot.timestamps import parse_timestamp
from deltastream.storage import storage_option_help
from deltastream.storage.paths import CONFINED, ExternalPaths, store_kind

__all__ = [
    "EXEC_TIMEOUT",
    "HTTP_TIMEOUT",
    "MAX_BYTES_PER_DELIVERY",
    "OPTIONS",
    "STREAM_NAME",
    "CliForm",
    "Mode",
    "OnMissingFile",
    "OnMissingVersions",
    "OnSchemaChange",
    "Option",
    "StartFrom",
    "StreamOption",
    "TailConfig",
    "TailOptions",
    "add_cli_options",
    "cli_options",
    "convert_options",
    "parse_key_values",
    "tail_config",
]


#: Bytes of Arrow data a delivery holds at most by default (``--max-bytes-per-delivery``):
#: a stream's memory stays bounded whatever its rows' width.
MAX_BYTES_PER_DELIVERY: Final = 128 << 20


class Mode(enum.Enum):
    #: The table at one version as ``insert`` rows, then stop.
    SNAPSHOT = "snapshot"
    #: The changes of every version from a starting version on.
    FOLLOW = "follow"
    #: The snapshot as ``insert`` rows, then the changes of every later version.
    SNAPSHOT_AND_FOLLOW = "snapshot-and-follow"


class OnSchemaChange(enum.Enum):
    STOP = "stop"
    CONTINUE = "continue"


class OnMissingVersions(enum.Enum):
    FAIL = "fail"
    RESUME_FROM_CHECKPOINT = "resume-from-checkpoint"


#: How a stream stopped by commits removed before it read them goes on, for its messages.
SKIP_MISSING_VERSIONS = (
    "set on_missing_versions to 'resume-from-checkpoint' and restart the stream to go on "
    "from the oldest checkpoint after them (the changes of the removed versions are not "
    "delivered; nothing else is lost or delivered twice)"
)


class OnMissingFile(enum.Enum):
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True)
class StartFrom:
    """Where a new stream starts: a version, a timestamp (epoch ms) or the latest version.

    For ``follow``, the first version whose changes are delivered (``latest``: the next
    version to be committed; a timestamp: the first version committed at or after it). For
    the snapshot modes, the version of the snapshot (a timestamp: the version current then).
    """

    version: int | None = None
    timestamp_ms: int | None = None

    @classmethod
    def parse(cls, text: str) -> StartFrom:
        """``latest``, a version number, or an ISO-8601 timestamp."""
        text = text.strip()
        if text.lower() == "latest":
            return cls()
        if text.isdigit():
            return cls(version=int(text))
        return cls(timestamp_ms=parse_timestamp(text))

    def __str__(self) -> str:
        if self.version is not None:
            return str(self.version)
        if self.timestamp_ms is not None:
            return f"timestamp {self.timestamp_ms}"
        return "latest"


# --- the vocabulary of the definition ------------------------------------------------------


@dataclass(frozen=True)
class Must:
    """What a valid value is, for errors: ``'<key>' <phrase>, not <value>``."""

    phrase: str


class CliForm(enum.Enum):
    """How an option is given on the command line."""

    #: ``--flag VALUE``: text, read as the field's type (an enum: one of its values).
    VALUE = "value"
    #: ``--flag`` alone, for a boolean: sets the opposite of its default.
    SWITCH = "switch"
    #: ``--flag KEY=VALUE``, repeated: a mapping.
    PAIRS = "pairs"
    #: ``--flag A,B,C``: a list (empty: the default).
    LIST = "list"
    #: ``--flag [ROOT ...]``: alone, ``True``; with values, those (a list).
    ROOTS = "roots"
    #: ``--flag 'Name: value'``, repeated: HTTP headers (a mapping).
    HEADERS = "headers"


@dataclass(frozen=True)
class Secret:
    """Marks a setting whose values are credentials: errors about it never show them."""


@dataclass(frozen=True)
class Option:
    """Marks a :class:`TailConfig` field as a setting users give, and how they give it."""

    flag: str
    help: str
    form: CliForm = CliForm.VALUE
    #: The TOML key, when it cannot be the field's name (``from`` is a Python keyword).
    key: str | None = None
    metavar: str | None = None


@dataclass(frozen=True)
class StreamOption:
    """One setting users give, resolved from the definition (see :data:`OPTIONS`)."""

    #: The :class:`TailConfig` field, which is also the keyword of ``deltastream.tail``.
    name: str
    #: The key in a ``serve`` file's ``[[tables]]`` and ``[defaults]``.
    key: str
    flag: str
    help: str
    form: CliForm
    metavar: str | None
    default: object
    #: The accepted values, for an enum.
    choices: tuple[str, ...] | None


E = TypeVar("E", bound=enum.Enum)


def _member(kind: type[E], value: object) -> object:
    """An enum's member from its value; anything else is left for the type check to refuse
    (with the list of choices)."""
    if isinstance(value, str):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _by_value(kind: type[enum.Enum]) -> BeforeValidator:
    return BeforeValidator(functools.partial(_member, kind))


def _start(value: object) -> object:
    if isinstance(value, str):
        return StartFrom.parse(value)  # its errors say what is wrong with the text
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return StartFrom(version=value)
    if isinstance(value, dt.date):  # a TOML date or date-time, written without quotes
        return StartFrom.parse(value.isoformat())
    return value


def _texts(value: object) -> object:
    """Scalar option values as text: storage options are strings to the stores, which parse
    and check them (``max_attempts = 5`` in TOML means ``"5"``); tables and lists are refused."""
    if not isinstance(value, Mapping):
        return value

    def text(v: object) -> object:
        if isinstance(v, bool):
            return "true" if v else "false"
        return str(v) if isinstance(v, int | float) else v

    return {k: text(v) for k, v in value.items()}


def _size(value: object) -> object:
    """A size's text (``128m``, ``134217728``) as bytes; anything else is left for the type
    check to refuse."""
    if isinstance(value, str):
        size = parse_size(value)
        return value if size is None else size
    return value


def _tuple(value: object) -> object:
    return tuple(value) if isinstance(value, list) else value


def _external_paths(value: object) -> object:
    """``true``/``false`` or a list of roots (TOML, Python; the command line gives ``True``
    for the flag alone) as :class:`ExternalPaths`; anything else is left for the type check
    to refuse."""
    if isinstance(value, bool | ExternalPaths) or (
        isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
    ):
        return ExternalPaths.of(value)
    return value


def _http_headers(value: object) -> object:
    """Header templates, checked: each name, and each value with its environment variables
    read (they must be set now); the templates are kept (read again when the sink is made),
    so that the secrets they name stay out of the config. Anything but a table of strings
    is left for the type check to refuse."""
    if isinstance(value, Mapping) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        resolve_http_headers(value)
        return dict(value)
    return value


Text = Annotated[str, Must("must be a string")]
Seconds = Annotated[
    float, Field(gt=0, allow_inf_nan=False), Must("must be a positive number of seconds")
]
Count = Annotated[int, Field(ge=1), Must("must be a whole number >= 1")]
Size = Annotated[
    int,
    BeforeValidator(_size),
    Field(ge=1),
    Must("must be a number of bytes >= 1 or a size such as 512m or 1g"),
]
Switch = Annotated[bool, Must("must be true or false")]
Options = Annotated[Mapping[str, str], BeforeValidator(_texts), Must("must be a table of strings")]


# --- the definition ------------------------------------------------------------------------


@dataclass(frozen=True)
class TailConfig:
    """One stream: which table, from where, to which sink, with which state directory.

    Every value is checked (and put in its canonical form: an enum member from its value, a
    tuple of columns) when the config is made, also by ``dataclasses.replace``."""

    name: Annotated[
        str,
        Field(pattern=STREAM_NAME),
        Must("may only hold letters, digits, '.', '-' and '_' (not only dots)"),
    ]
    uri: Text
    state: Text
    mode: Annotated[Mode, _by_value(Mode), Option("--mode", "what to deliver")] = (
        Mode.SNAPSHOT_AND_FOLLOW
    )
    start: Annotated[
        StartFrom,
        BeforeValidator(_start),
        Must("must be 'latest', a version number or an ISO-8601 timestamp"),
        Option(
            "--from",
            "follow: the first version (N, an ISO-8601 time, or latest: the next commit); "
            "snapshot modes: the snapshot's version",
            key="from",
            metavar="START",
        ),
    ] = field(default_factory=StartFrom)
    storage_options: Annotated[
        Options,
        Option(
            "--storage-option",
            f"object store setting ({storage_option_help()}); may repeat",
            CliForm.PAIRS,
            metavar="KEY=VALUE",
        ),
    ] = field(default_factory=dict, repr=False)  # may hold keys and tokens: never in reprs
    #: Options for the state directory's store (default: ``storage_options`` if both are in
    #: object stores of one kind).
    state_storage_options: Annotated[
        Mapping[str, str] | None,
        BeforeValidator(_texts),
        Must("must be a table of strings"),
        Option(
            "--state-storage-option",
            "object store setting for the state directory (default: --storage-option if "
            "both are in object stores of one kind); may repeat",
            CliForm.PAIRS,
            metavar="KEY=VALUE",
        ),
    ] = field(default=None, repr=False)
    #: Options for the store of a sink that writes to one (``delta:s3://…``; default:
    #: ``storage_options`` if the sink's target and the table are in object stores of one
    #: kind).
    sink_options: Annotated[
        Mapping[str, str] | None,
        BeforeValidator(_texts),
        Must("must be a table of strings"),
        Option(
            "--sink-option",
            "store setting for a delta sink's target (default: --storage-option if both are "
            "in object stores of one kind); may repeat",
            CliForm.PAIRS,
            metavar="KEY=VALUE",
        ),
    ] = field(default=None, repr=False)
    columns: Annotated[
        Sequence[str] | None,
        BeforeValidator(_tuple),
        Must("must be a list of column names"),
        Option("--columns", "comma-separated data columns (default: all)", CliForm.LIST),
    ] = None
    where: Annotated[
        str | None,
        Must("must be a predicate (a string)"),
        Option(
            "--where",
            "deliver only the change rows matching this predicate (the language of read "
            "--where; it may name _change_type, _commit_version and _commit_timestamp)",
            metavar="EXPR",
        ),
    ] = None
    #: Each row's row id and row commit version (:mod:`deltastream.read.row_ids`).
    row_ids: Annotated[
        Switch,
        Option(
            "--row-ids",
            "add each row's _row_id and _row_commit_version (a table with row tracking; "
            "implied by a mirror keyed on _row_id)",
            CliForm.SWITCH,
        ),
    ] = False
    poll_interval: Annotated[Seconds, Option("--poll-interval", "seconds between polls")] = 1.0
    #: With a change feed the stream trusts (notifications), listing the log is only a
    #: safety net, this often (:mod:`~deltastream.daemon.stream.watcher`).
    safety_poll_interval: Annotated[
        Seconds,
        Option(
            "--safety-poll-interval",
            "seconds between polls while notifications are trusted (they wake the stream "
            "at once; after a lapse, --poll-interval until trusted again)",
        ),
    ] = DEFAULT_SAFETY_POLL_INTERVAL
    #: Each poll moves by up to ± this fraction of the gap between the polls of the
    #: process's tables (of the whole interval when it follows one table): polls are spread
    #: evenly over the interval (:mod:`~deltastream.daemon.stream.poll_schedule`).
    poll_jitter: Annotated[
        float, Field(ge=0, lt=1, allow_inf_nan=False), Must("must be a fraction in [0, 1)")
    ] = 0.1
    notifications: Annotated[
        Switch,
        Option(
            "--no-notifications",
            "poll only (no filesystem notifications or SQS wake-ups)",
            CliForm.SWITCH,
        ),
    ] = True
    on_schema_change: Annotated[
        OnSchemaChange,
        _by_value(OnSchemaChange),
        Option(
            "--on-schema-change",
            "a non-additive schema change stops the stream, or is followed",
        ),
    ] = OnSchemaChange.STOP
    on_missing_versions: Annotated[
        OnMissingVersions,
        _by_value(OnMissingVersions),
        Option(
            "--on-missing-versions",
            "commits removed before they were read: fail, or skip to the oldest checkpoint",
        ),
    ] = OnMissingVersions.FAIL
    on_missing_file: Annotated[
        OnMissingFile,
        _by_value(OnMissingFile),
        Option(
            "--on-missing-file",
            "a data file vacuumed before it was read: fail, or skip it, logging it",
        ),
    ] = OnMissingFile.FAIL
    #: Produce changes from add/remove actions for versions written without change data.
    infer_without_cdf: Annotated[
        Switch,
        Option(
            "--infer-without-cdf",
            "deliver versions written without change data as whole-file deletes and inserts",
            CliForm.SWITCH,
        ),
    ] = False
    #: Files outside the table root its log may make the stream read (default: none).
    allow_external_paths: Annotated[
        ExternalPaths,
        BeforeValidator(_external_paths),
        Must("must be true, false or a list of absolute paths or URIs"),
        Option(
            "--allow-external-paths",
            "read files the log names outside the table root: any (the flag alone) or "
            "those under the ROOTs given",
            CliForm.ROOTS,
            metavar="ROOT",
        ),
    ] = CONFINED
    #: A delivery closes once it holds this many rows, or ``max_bytes_per_delivery`` bytes
    #: (whole record batches: one batch always fits). ``None``: the sink's own
    #: (:meth:`resolved_max_rows_per_delivery`).
    max_rows_per_delivery: Annotated[
        int | None,
        Field(ge=1),
        Must("must be a whole number >= 1"),
        Option(
            "--max-rows-per-delivery",
            "rows per delivery at most (default: the sink's own: "
            f"{COMMIT_ROWS_PER_DELIVERY} for the delta and postgresql sinks, whose every "
            f"delivery is a commit, {ROWS_PER_DELIVERY} for the others)",
        ),
    ] = None
    max_bytes_per_delivery: Annotated[
        Size,
        Option(
            "--max-bytes-per-delivery",
            "bytes of Arrow data per delivery at most: a number or a size such as 64m or 1g",
            metavar="SIZE",
        ),
    ] = MAX_BYTES_PER_DELIVERY
    max_versions_per_round: Count = 1_000
    #: Save the table state every this many versions or seconds (whichever comes first).
    checkpoint_every_versions: Annotated[
        Count,
        Option(
            "--checkpoint-every-versions",
            "save the stream's snapshot every K versions",
            metavar="K",
        ),
    ] = 1_000
    # Zero is allowed here (save after every round); the interval between polls is not.
    checkpoint_every_seconds: Annotated[
        float,
        Field(ge=0, allow_inf_nan=False),
        Must("must be a number of seconds >= 0"),
        Option(
            "--checkpoint-every-seconds",
            "... or every T seconds, whichever comes first",
            metavar="T",
        ),
    ] = 600.0
    #: Replay at most this many commits on top of a saved state; beyond, or when catching up
    #: more versions than this, the table's own checkpoint is used.
    replay_limit: Count = 100
    #: Headers the http sink sends with every request; ``${NAME}`` in a value is the
    #: environment variable NAME. Never shown (reprs, errors, logs, ``--help``).
    http_headers: Annotated[
        Mapping[str, str],
        BeforeValidator(_http_headers),
        Must("must be a table of header names and string values"),
        Secret(),
        Option(
            "--http-header",
            "http sink: a header sent with every request ('${VAR}' in the value: the "
            "environment variable VAR; quote it so the shell leaves it); may repeat",
            CliForm.HEADERS,
            metavar="'NAME: VALUE'",
        ),
    ] = field(default_factory=dict, repr=False)
    http_timeout: Annotated[
        Seconds,
        Option("--http-timeout", "http sink: seconds each request may take", metavar="SECONDS"),
    ] = HTTP_TIMEOUT
    http_verify: Annotated[
        Switch,
        Option(
            "--http-no-verify",
            "http sink: do not verify the server's TLS certificate (test endpoints only)",
            CliForm.SWITCH,
        ),
    ] = True
    http_ca_bundle: Annotated[
        str | None,
        Must("must be a path (a string)"),
        Option(
            "--http-ca-bundle",
            "http sink: verify the server's TLS certificate against the CA certificates in "
            "this PEM file instead of the system's",
            metavar="PATH",
        ),
    ] = None
    exec_timeout: Annotated[
        Seconds,
        Option(
            "--exec-timeout",
            "exec sink: seconds each run of the command may take; then its process group is "
            "killed and the run retried",
            metavar="SECONDS",
        ),
    ] = EXEC_TIMEOUT

    def resolved_max_rows_per_delivery(self, sink: Sink) -> int:
        """The rows a delivery to ``sink`` holds at most: ``max_rows_per_delivery`` if given,
        else the sink's own :attr:`~deltastream.daemon.delivery.Sink.rows_per_delivery`."""
        given = self.max_rows_per_delivery
        return sink.rows_per_delivery if given is None else given

    def row_options(self, sink: Sink) -> dict[str, str]:
        """The options that decide which rows a version gives, by their names, as text
        (those at their defaults left out; ``sink``: a mirror keyed on ``_row_id`` implies
        row ids). A stream's state records them: a position inside a version counts its rows
        as they produced them."""
        values = {
            "columns": ",".join(self.columns) if self.columns is not None else None,
            "where": self.where,
            "row_ids": "true" if self.row_ids or sink.row_ids else None,
            "infer_without_cdf": "true" if self.infer_without_cdf else None,
        }
        return {name: value for name, value in values.items() if value is not None}

    @property
    def resolved_http_headers(self) -> dict[str, str]:
        """``http_headers`` with the environment variables in their values read."""
        return resolve_http_headers(self.http_headers)

    @property
    def resolved_state_options(self) -> Mapping[str, str]:
        """The state store's options: ``state_storage_options``, or by default the table's
        ``storage_options`` when both are in object stores of the same kind (both on S3, both
        on GCS, both on Azure)."""
        return self._store_options(self.state_storage_options, self.state)

    def resolved_sink_options(self, target: str) -> Mapping[str, str]:
        """The options of the store a sink writes to at ``target`` (a delta sink's table):
        ``sink_options``, or by default the table's ``storage_options`` when both are in
        object stores of the same kind."""
        return self._store_options(self.sink_options, target)

    def _store_options(self, given: Mapping[str, str] | None, uri: str) -> Mapping[str, str]:
        # One rule for every other store a stream uses: its own options if given, else the
        # table's when they can apply (the same kind of object store), else none.
        if given is not None:
            return given
        kind = store_kind(self.uri)
        same_store = kind != "file" and store_kind(uri) == kind
        return self.storage_options if same_store else {}

    def __post_init__(self) -> None:
        for spec in _FIELDS.values():
            value = _convert(spec, getattr(self, spec.name), spec.name)
            object.__setattr__(self, spec.name, value)


class TailOptions(TypedDict, total=False):
    """The options of :data:`OPTIONS` as keywords of ``deltastream.tail`` (for type checkers:
    their defaults are :class:`TailConfig`'s; a test keeps the two in step)."""

    mode: Mode | str
    start: StartFrom | str | int
    storage_options: Mapping[str, str]
    state_storage_options: Mapping[str, str] | None
    sink_options: Mapping[str, str] | None
    columns: Sequence[str] | None
    where: str | None
    row_ids: bool
    poll_interval: float
    safety_poll_interval: float
    notifications: bool
    on_schema_change: OnSchemaChange | str
    on_missing_versions: OnMissingVersions | str
    on_missing_file: OnMissingFile | str
    infer_without_cdf: bool
    allow_external_paths: bool | Sequence[str]
    max_rows_per_delivery: int | None
    max_bytes_per_delivery: int | str
    checkpoint_every_versions: int
    checkpoint_every_seconds: float
    http_headers: Mapping[str, str]
    http_timeout: float
    http_verify: bool
    http_ca_bundle: str | None
    exec_timeout: float


# --- reading the definition ----------------------------------------------------------------


@dataclass(frozen=True)
class _Field:
    name: str
    adapter: TypeAdapter[Any]
    must: str
    #: Errors do not show the value (:class:`Secret`).
    secret: bool = False


def _describe() -> tuple[dict[str, _Field], dict[str, StreamOption]]:
    hints = get_type_hints(TailConfig, include_extras=True)
    specs: dict[str, _Field] = {}
    options: dict[str, StreamOption] = {}
    for f in fields(TailConfig):
        hint = hints[f.name]
        metadata = getattr(hint, "__metadata__", ())
        base = get_args(hint)[0] if metadata else hint
        members: list[enum.Enum] = list(base) if isinstance(base, enum.EnumMeta) else []
        choices = tuple(str(m.value) for m in members) or None
        must = next((m.phrase for m in metadata if isinstance(m, Must)), None)
        if must is None:
            assert choices is not None, f"TailConfig.{f.name} needs a Must phrase"
            must = f"must be one of {', '.join(repr(c) for c in choices)}"
        secret = any(isinstance(m, Secret) for m in metadata)
        specs[f.name] = _Field(f.name, TypeAdapter(hint), must, secret)
        option = next((m for m in metadata if isinstance(m, Option)), None)
        if option is not None:
            default = f.default_factory() if f.default_factory is not MISSING else f.default
            options[f.name] = StreamOption(
                name=f.name,
                key=option.key or f.name,
                flag=option.flag,
                help=option.help,
                form=option.form,
                metavar=option.metavar,
                default=default,
                choices=choices,
            )
    return specs, options


def _convert(spec: _Field, value: object, label: str, *, text: bool = False) -> object:
    """``value`` checked against the field's type and constraints (``text``: read from a
    command line's string); errors name ``label`` and the value."""
    try:
        if text:
            return spec.adapter.validate_strings(value, strict=True)
        return spec.adapter.validate_python(value, strict=True)
    except ValidationError as e:
        cause = e.errors()[0].get("ctx", {}).get("error")
        if isinstance(cause, InvalidArgumentError):  # a parser's own words (a timestamp)
            raise InvalidArgumentError(f"{label!r}: {cause}") from None
        shown = "" if spec.secret else f", not {value!r}"
        raise InvalidArgumentError(f"{label!r} {spec.must}{shown}") from None


_FIELDS, _OPTIONS = _describe()
#: The settings users give, by :class:`TailConfig` field (= ``deltastream.tail`` keyword),
#: in the definition's order.
OPTIONS: Mapping[str, StreamOption] = _OPTIONS
_BY_KEY = {o.key: o.name for o in OPTIONS.values()}


def convert_options(values: Mapping[str, object], *, toml: bool = False) -> dict[str, object]:
    """Options by ``deltastream.tail`` keyword (``toml``: by TOML key) checked and converted,
    by :class:`TailConfig` field. Unknown keys are errors."""
    names = _BY_KEY if toml else {name: name for name in OPTIONS}
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise InvalidArgumentError(
            f"unknown option(s) {unknown}; known options: {', '.join(names)}"
        )
    return {names[k]: _convert(_FIELDS[names[k]], v, k) for k, v in values.items()}


def tail_config(
    name: str, uri: str, state: str, options: Mapping[str, object], *, toml: bool = False
) -> TailConfig:
    """A stream's config from its identity and ``options`` (see :func:`convert_options`);
    options not given take :class:`TailConfig`'s defaults."""
    values: dict[str, Any] = {
        key: _convert(_FIELDS[key], value, key)
        for key, value in (("name", name), ("uri", uri), ("state", state))
    }
    values.update(convert_options(options, toml=toml))
    return TailConfig(**values)


# --- the command line ----------------------------------------------------------------------

_FROM_TIMESTAMP = "--from-timestamp"


def add_cli_options(parser: argparse.ArgumentParser) -> None:
    """Add every option of :data:`OPTIONS` to ``tail``'s parser. An option not given is left
    ``None``, so that :class:`TailConfig`'s default applies."""
    for option in OPTIONS.values():
        text = option.help
        if option.form is CliForm.VALUE and option.default is not None:
            default = option.default
            shown = default.value if isinstance(default, enum.Enum) else default
            text += f" (default: {shown:g})" if isinstance(shown, float) else f" (default: {shown})"
        settings: dict[str, Any] = {"dest": option.name, "default": None, "help": text}
        if option.form is CliForm.SWITCH:
            # The flag says the opposite of the default: --no-notifications, --infer-…
            settings["action"] = "store_false" if option.default else "store_true"
        else:
            repeated = option.form in (CliForm.PAIRS, CliForm.HEADERS)
            settings["action"] = "append" if repeated else "store"
            settings.update(choices=option.choices, metavar=option.metavar)
            if option.form is CliForm.ROOTS:
                settings["nargs"] = "*"
        if option.name != "start":
            parser.add_argument(option.flag, **settings)
            continue
        group = parser.add_mutually_exclusive_group()
        group.add_argument(option.flag, **settings)
        # The same StartFrom as --from with a timestamp, but only a timestamp: a second flag,
        # not a second field.
        group.add_argument(
            _FROM_TIMESTAMP,
            dest="start_timestamp",
            metavar="TS",
            help="follow: the first version committed at or after TS (ISO-8601); "
            "snapshot modes: the last version committed at or before it",
        )


def cli_options(args: argparse.Namespace) -> dict[str, object]:
    """The options given on ``tail``'s command line, checked, by :class:`TailConfig` field;
    errors name the flag."""
    values: dict[str, object] = {}
    for option in OPTIONS.values():
        raw = getattr(args, option.name, None)
        if raw is None:
            continue
        spec = _FIELDS[option.name]
        if option.form is CliForm.PAIRS:
            values[option.name] = _convert(spec, parse_key_values(raw, option.flag), option.flag)
        elif option.form is CliForm.HEADERS:
            values[option.name] = _convert(spec, parse_headers(raw, option.flag), option.flag)
        elif option.form is CliForm.LIST:
            items = [item.strip() for item in raw.split(",") if item.strip()]
            values[option.name] = _convert(spec, items or None, option.flag)
        elif option.form is CliForm.SWITCH:
            values[option.name] = _convert(spec, raw, option.flag)
        elif option.form is CliForm.ROOTS:
            values[option.name] = _convert(spec, list(raw) or True, option.flag)
        else:
            values[option.name] = _convert(spec, raw, option.flag, text=True)
    timestamp = getattr(args, "start_timestamp", None)
    if timestamp is not None:
        try:
            values["start"] = StartFrom(timestamp_ms=parse_timestamp(timestamp))
        except InvalidArgumentError as e:
            raise InvalidArgumentError(f"{_FROM_TIMESTAMP!r}: {e}") from None
    return values


def parse_headers(lines: Sequence[str], flag: str) -> dict[str, str]:
    """``Name: value`` command-line values as a dict (errors name ``flag``, never a value)."""
    headers: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            raise InvalidArgumentError(f"{flag} expects 'Name: value' (the value is not shown)")
        headers[name.strip()] = value.strip()
    return headers


def parse_key_values(pairs: Sequence[str], flag: str) -> dict[str, str]:
    """``KEY=VALUE`` command-line values (``flag`` names the option in errors) as a dict."""
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidArgumentError(f"{flag} expects KEY=VALUE, got {pair!r}")
        options[key] = value
    return options
