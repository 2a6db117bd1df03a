"""The ``serve`` configuration file (TOML): the service's settings and its streams.

::

    [server]
    http = "127.0.0.1:9464"      # /healthz, /livez and /metrics; "" turns the server off
    log_format = "text"          # or "json"
    log_level = "info"
    shutdown_grace = 8           # seconds streams get to stop on SIGTERM/SIGINT
    work_dir = "/var/tmp/deltastream"   # batch files of exec sinks
    degraded_after_seconds = 60  # /healthz 503 once a stream retried this long in vain
    max_restarts = 3             # ... or restarted more often than this
    restart_window_seconds = 600 # ... within this many seconds

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

Unknown keys are errors (a typo must not silently fall back to a default).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from deltastream.daemon.service import ServiceConfig, StreamConfig
from deltastream.daemon.sinks import parse_sink
from deltastream.daemon.tailer import (
    Mode,
    OnMissingFile,
    OnMissingVersions,
    OnSchemaChange,
    StartFrom,
    TailConfig,
)
from deltastream.errors import InvalidArgumentError

__all__ = ["SERVER_KEYS", "TABLE_KEYS", "load_config", "parse_config"]

SERVER_KEYS = (
    "http",
    "log_format",
    "log_level",
    "shutdown_grace",
    "work_dir",
    "degraded_after_seconds",
    "max_restarts",
    "restart_window_seconds",
)
#: Keys of a ``[[tables]]`` entry (and of ``[defaults]``, plus ``state_dir``).
TABLE_KEYS = (
    "name",
    "uri",
    "sink",
    "state",
    "mode",
    "from",
    "storage_options",
    "state_storage_options",
    "columns",
    "poll_interval",
    "notifications",
    "on_schema_change",
    "on_missing_versions",
    "on_missing_file",
    "infer_without_cdf",
    "max_rows_per_delivery",
    "checkpoint_every_versions",
    "checkpoint_every_seconds",
)
_REQUIRED = ("name", "uri", "sink")


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
    http = server.get("http", "127.0.0.1:9464")
    try:
        return ServiceConfig(
            streams=tuple(streams),
            http_address=_str(http, "http", source) or None,
            shutdown_grace=float(server.get("shutdown_grace", 8.0)),
            work_dir=server.get("work_dir"),
            log_format=_str(server.get("log_format", "text"), "log_format", source),
            log_level=_str(server.get("log_level", "info"), "log_level", source),
            # Negative and NaN values are refused by ServiceConfig, naming the key.
            degraded_after_seconds=_seconds(server, "degraded_after_seconds", 60.0),
            max_restarts=_count(server, "max_restarts", 3),
            restart_window_seconds=_seconds(server, "restart_window_seconds", 600.0),
        )
    except (TypeError, ValueError) as e:
        if isinstance(e, InvalidArgumentError):
            raise InvalidArgumentError(f"{source}: {e}") from e
        raise InvalidArgumentError(f"{source} [server]: {e}") from e


def _stream(entry: Mapping[str, Any], where: str) -> StreamConfig:
    for key in _REQUIRED:
        if key not in entry:
            raise InvalidArgumentError(f"{where}: missing {key!r}")
    name = _str(entry["name"], "name", where)
    where = f"{where} ({name})"
    state = entry.get("state")
    if state is None:
        state_dir = entry.get("state_dir")
        if state_dir is None:
            raise InvalidArgumentError(f"{where}: needs 'state' (or 'state_dir' in [defaults])")
        state = f"{_str(state_dir, 'state_dir', where).rstrip('/')}/{name}"
    try:
        tail = TailConfig(
            name=name,
            uri=_str(entry["uri"], "uri", where),
            state=_str(state, "state", where),
            mode=_enum(Mode, entry.get("mode", Mode.SNAPSHOT_AND_FOLLOW.value), "mode", where),
            start=StartFrom.parse(str(entry.get("from", "latest"))),
            storage_options=_options(entry.get("storage_options", {}), "storage_options", where),
            state_storage_options=(
                _options(entry["state_storage_options"], "state_storage_options", where)
                if "state_storage_options" in entry
                else None
            ),
            columns=_columns(entry.get("columns"), where),
            poll_interval=float(entry.get("poll_interval", 1.0)),
            notifications=bool(entry.get("notifications", True)),
            on_schema_change=_enum(
                OnSchemaChange, entry.get("on_schema_change", "stop"), "on_schema_change", where
            ),
            on_missing_versions=_enum(
                OnMissingVersions,
                entry.get("on_missing_versions", "fail"),
                "on_missing_versions",
                where,
            ),
            on_missing_file=_enum(
                OnMissingFile, entry.get("on_missing_file", "fail"), "on_missing_file", where
            ),
            infer_without_cdf=bool(entry.get("infer_without_cdf", False)),
            max_rows_per_delivery=int(entry.get("max_rows_per_delivery", 100_000)),
            checkpoint_every_versions=int(entry.get("checkpoint_every_versions", 1_000)),
            checkpoint_every_seconds=float(entry.get("checkpoint_every_seconds", 600.0)),
        )
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"{where}: {e}") from e
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"{where}: {e}") from e
    return StreamConfig(tail, _str(entry["sink"], "sink", where))


def _check_sink_outputs(streams: list[StreamConfig], source: str) -> None:
    """Every sink spec names a sink, and no two streams write to one output."""
    owners: dict[str, str] = {}
    for stream in streams:
        name = stream.tail.name
        try:
            claim = parse_sink(stream.sink, table=name).output_claim(name)
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


def _str(value: object, key: str, where: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{where}: {key!r} must be a string, not {value!r}")
    return value


def _seconds(server: Mapping[str, Any], key: str, default: float) -> float:
    value = server.get(key, default)
    # bool is an int to Python, but ``true`` is no number of seconds (nor of restarts).
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{key!r} must be a number of seconds, not {value!r}")
    return float(value)


def _count(server: Mapping[str, Any], key: str, default: int) -> int:
    value = server.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{key!r} must be a whole number, not {value!r}")
    return value


def _options(value: object, key: str, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"{where}: {key!r} must be a table of strings")
    return {str(k): str(v) for k, v in value.items()}


def _columns(value: object, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
        raise InvalidArgumentError(f"{where}: 'columns' must be a list of column names")
    return tuple(value)


E = TypeVar("E", Mode, OnSchemaChange, OnMissingVersions, OnMissingFile)


def _enum(kind: type[E], value: object, key: str, where: str) -> E:
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in kind)
        raise InvalidArgumentError(
            f"{where}: {key!r} must be one of {choices}, not {value!r}"
        ) from None
