"""The ``serve`` configuration file (TOML): the service's settings and its streams.

::

    [server]
    http = "127.0.0.1:9464"      # /healthz, /livez and /metrics; "" turns the server off
    log_format = "text"          # or "json"
    log_level = "info"
    log_summary_interval = 60    # seconds between each stream's summary line; 0: none
    shutdown_grace = 8           # seconds streams get to stop on SIGTERM/SIGINT
    work_dir = "/var/tmp/deltastream"   # batch files of exec sinks
    degraded_after_seconds = 60  # /healthz 503 once a stream retried this long in vain
    max_restarts = 3             # ... or restarted more often than this
    restart_window_seconds = 600 # ... within this many seconds
    # stuck_after_seconds = 300  # /healthz 503 "stuck" after this long without progress
                                 # (unset: max(120 s, 10 poll intervals,
                                 #  2 safety poll intervals) per stream)

    [defaults]                   # any table key; applies to every table that does not set it
    state_dir = "/var/lib/deltastream"  # a table's state defaults to <state_dir>/<name>
    poll_interval = 1.0

    [[tables]]
    name = "orders"
    uri = "s3://lake/orders"
    sink = "jsonl:/data/orders.jsonl"
    mode = "snapshot-and-follow" # or "snapshot", "follow"
    from = "latest"              # a version, an ISO-8601 timestamp, or "latest"
    storage_options = { region = "eu-west-1", sqs_queue_url = "https://…" }

Unknown keys are errors (a typo must not silently fall back to a default). A table's keys
besides ``name``, ``uri``, ``sink`` and ``state`` are the stream options defined, with their
defaults and constraints, in :mod:`deltastream.daemon.stream.config`, and are checked as
strictly (``notifications = "false"`` is an error, not true). Every error names the file and
the section or ``[[tables]]`` entry once, then the key and the value.

An http sink's settings are such options too::

    sink = "https://ingest.example.com/orders"
    http_headers = { Authorization = "Bearer ${INGEST_TOKEN}" }
    http_timeout = 10            # seconds per request (default 30)
    http_verify = true           # false: no TLS certificate verification (test endpoints)
    http_ca_bundle = "/etc/ssl/ingest-ca.pem"   # verify against these CAs, not the system's

``${NAME}`` in a header is the environment variable NAME: it must be set when the file is
loaded (an unset one is an error naming it), and header values are never shown.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from deltastream.daemon.replicas.coordinator import GroupSettings
from deltastream.daemon.service.address import parse_address
from deltastream.daemon.service.supervisor import ServiceConfig, StreamConfig
from deltastream.daemon.sinks import parse_sink
from deltastream.daemon.stream.config import OPTIONS, convert_options, tail_config
from deltastream.errors import InvalidArgumentError

__all__ = ["GROUP_DIR", "SERVER_KEYS", "TABLE_KEYS", "load_config", "parse_config"]

SERVER_KEYS = (
    "http",
    "log_format",
    "log_level",
    "log_summary_interval",
    "shutdown_grace",
    "work_dir",
    "degraded_after_seconds",
    "max_restarts",
    "restart_window_seconds",
    "stuck_after_seconds",
    "group",
    "group_storage_options",
    "lease_ttl",
    "shards",
    "rebalance_delay",
)
#: The lease directory's name under ``[defaults] state_dir`` (no stream may be named so).
GROUP_DIR = "_replicas"
#: Keys of a ``[[tables]]`` entry (and of ``[defaults]``, plus ``state_dir``): the stream's
#: identity, its sink, and the stream options.
TABLE_KEYS = ("name", "uri", "sink", "state", *(option.key for option in OPTIONS.values()))
_REQUIRED = ("name", "uri", "sink")
_OPTION_KEYS = frozenset(option.key for option in OPTIONS.values())


def load_config(path: str | Path) -> ServiceConfig:
    """Read and check a configuration file."""
    source = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise InvalidArgumentError(f"{source}: cannot read: {e.strerror or e}") from e
    try:
        document = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise InvalidArgumentError(f"{source}: not valid TOML: {e}") from e
    return parse_config(document, source)


def parse_config(document: Mapping[str, Any], source: str = "config") -> ServiceConfig:
    _only(document, ("server", "defaults", "tables"), source)
    server = _table(document, "server", source)
    _only(server, SERVER_KEYS, f"{source} [server]")
    defaults = _table(document, "defaults", source)
    _only(defaults, (*TABLE_KEYS, "state_dir"), f"{source} [defaults]")
    # Checked here too, so that a wrong default is reported once, as [defaults]' own.
    try:
        convert_options({k: v for k, v in defaults.items() if k in _OPTION_KEYS}, toml=True)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"{source} [defaults]: {e}") from None
    tables = document.get("tables", [])
    if not isinstance(tables, list) or not tables:
        raise InvalidArgumentError(f"{source}: needs at least one [[tables]] entry")
    streams = []
    for i, entry in enumerate(tables):
        where = f"{source} [[tables]] #{i + 1}"
        if not isinstance(entry, dict):
            raise InvalidArgumentError(f"{where}: must be a table")
        _only(entry, TABLE_KEYS, where)
        merged = {**defaults, **entry}
        streams.append(_stream(merged, where))
    _check_sink_outputs(streams, source)
    try:
        http = _str(server.get("http", "127.0.0.1:9464"), "http")
        if http:
            parse_address(http, "'http'")
        # Only the keys given: ServiceConfig holds the defaults (one place for them).
        settings: dict[str, Any] = {
            key: check(server, key) for key, check in _SERVER_SETTINGS.items() if key in server
        }
        group = _group(server, defaults, streams)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"{source} [server]: {e}") from None
    try:
        # Negative and NaN values are refused by ServiceConfig, naming the key; so are
        # streams sharing a name or a state directory.
        return ServiceConfig(
            streams=tuple(streams),
            http_address=http or None,
            work_dir=server.get("work_dir"),
            group=group,
            **settings,
        )
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"{source}: {e}") from e
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"{source} [server]: {e}") from e


def _group(
    server: Mapping[str, Any], defaults: Mapping[str, Any], streams: list[StreamConfig]
) -> GroupSettings | None:
    """The replica group's settings: its lease directory is ``[server] group``, or by
    default ``_replicas`` under ``[defaults] state_dir``; none without either (or with
    ``group = ""``), and then one process runs every stream, as ``tail`` does."""
    uri = server.get("group")
    if uri is None:
        state_dir = defaults.get("state_dir")
        if not isinstance(state_dir, str):
            return None
        uri = f"{state_dir.rstrip('/')}/{GROUP_DIR}"
    uri = _str(uri, "group")
    if not uri:
        return None
    options = server.get("group_storage_options")
    if options is None:
        # The streams' state store settings (from [defaults], the same for every stream).
        options = dict(streams[0].tail.resolved_state_options)
    elif not isinstance(options, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in options.items()
    ):
        raise InvalidArgumentError(
            f"'group_storage_options' must be a table of strings, not {options!r}"
        )
    given: dict[str, Any] = {}
    for key, check in (("lease_ttl", _seconds), ("shards", _count), ("rebalance_delay", _seconds)):
        if key in server:
            given[key] = check(server, key)
    for stream in streams:
        if stream.tail.state.rstrip("/") == uri.rstrip("/"):
            raise InvalidArgumentError(
                f"stream {stream.tail.name!r} keeps its state in the group's lease directory "
                f"{uri}; rename the stream or set 'group'"
            )
    return GroupSettings(uri, options, **given)


def _stream(entry: Mapping[str, Any], where: str) -> StreamConfig:
    """One ``[[tables]]`` entry (merged with ``[defaults]``); ``where`` names it in errors."""
    for key in _REQUIRED:
        if key not in entry:
            raise InvalidArgumentError(f"{where}: missing {key!r}")
    try:
        name = _str(entry["name"], "name")
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"{where}: {e}") from None
    where = f"{where} ({name})"
    # Every message below names the key and value only: the place is added here, once.
    try:
        state = entry.get("state")
        if state is None:
            state_dir = entry.get("state_dir")
            if state_dir is None:
                raise InvalidArgumentError("needs 'state' (or 'state_dir' in [defaults])")
            state = f"{_str(state_dir, 'state_dir').rstrip('/')}/{name}"
        options = {k: v for k, v in entry.items() if k in _OPTION_KEYS}
        tail = tail_config(
            name, _str(entry["uri"], "uri"), _str(state, "state"), options, toml=True
        )
        sink = _str(entry["sink"], "sink")
        # Every sink spec is checked here, where its [[tables]] entry can be named: a typo
        # (``kafka:x``) is a configuration error, not a stream that fails when it starts.
        parse_sink(sink, table=name, stream=tail)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"{where}: {e}") from None
    return StreamConfig(tail, sink)


def _check_sink_outputs(streams: list[StreamConfig], source: str) -> None:
    """Every sink spec names a sink, and no two streams write to one output."""
    owners: dict[str, str] = {}
    for stream in streams:
        name = stream.tail.name
        try:
            claim = parse_sink(stream.sink, table=name, stream=stream.tail).output_claim(name)
        except InvalidArgumentError as e:
            raise InvalidArgumentError(f"{source} [[tables]] ({name}): {e}") from e
        if claim is None:
            continue
        if claim in owners:
            raise InvalidArgumentError(
                f"{source}: streams {owners[claim]!r} and {name!r} write to the same output "
                f"({claim}); each stream needs its own sink output"
            )
        owners[claim] = name


def _only(value: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise InvalidArgumentError(
            f"{where}: unknown key(s) {unknown}; known keys: {', '.join(allowed)}"
        )


def _table(document: Mapping[str, Any], key: str, source: str) -> Mapping[str, Any]:
    value = document.get(key, {})
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"{source}: [{key}] must be a table")
    return value


def _str(value: object, key: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{key!r} must be a string, not {value!r}")
    return value


def _seconds(server: Mapping[str, Any], key: str) -> float:
    value = server[key]
    # bool is an int to Python, but ``true`` is no number of seconds (nor of restarts).
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{key!r} must be a number of seconds, not {value!r}")
    return float(value)


def _count(server: Mapping[str, Any], key: str) -> int:
    value = server[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{key!r} must be a whole number, not {value!r}")
    return value


def _text(server: Mapping[str, Any], key: str) -> str:
    return _str(server[key], key)


#: The ``[server]`` keys that are :class:`ServiceConfig` fields of the same name, and how
#: each is checked.
_SERVER_SETTINGS: dict[str, Callable[[Mapping[str, Any], str], Any]] = {
    "shutdown_grace": _seconds,
    "log_format": _text,
    "log_level": _text,
    "log_summary_interval": _seconds,
    "degraded_after_seconds": _seconds,
    "max_restarts": _count,
    "restart_window_seconds": _seconds,
    "stuck_after_seconds": _seconds,
}
