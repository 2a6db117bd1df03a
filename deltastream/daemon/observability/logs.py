"""Log output for the daemon: human-readable text lines or one JSON object per line, with
credentials redacted (:mod:`deltastream.daemon.observability.redaction`).

The daemon's log calls pass what they are about as structured fields (``extra=``), which a
JSON line carries as top-level keys next to ``time``, ``level``, ``logger`` and ``message``
(text lines show only the message, which says the same in words). The fields, by name (as
``/metrics`` labels its series: ``table`` there is the stream's name, ``uri`` its table):

``stream``
    the stream's name (``streams``: several);
``uri``
    the stream's table, as configured;
``sink``
    the sink, as specified (``jsonl:/data/orders.jsonl``);
``position``
    a position in the stream, as :class:`~deltastream.daemon.delivery.Position` prints it
    (``v13``, ``v13+500``, ``snapshot v12+1000``);
``version``, ``from_version``, ``to_version``
    a version, or the first and last versions with rows in a delivery;
``versions``, ``rows``, ``files``
    counts (versions passed and rows delivered, in a summary line or a delivery);
``duration_s``, ``interval_s``, ``delay_s``
    seconds: how long something took, the period a summary covers, the wait before a retry
    or a restart;
``error_class``
    the class of the exception a line reports (``SchemaChangeError``, ``ClientConnectorError``);
``operation``, ``target``, ``cause``, ``attempt``
    what a retry repeats (``GET``, ``POST``, ``exec``), on what (a URI, a URL, a command),
    why the attempt failed (``HTTP 503``), and which attempt it was;
``status``, ``lag_versions``
    a stream's state (``following``, ``retrying``, …) and how many versions it is behind.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from typing import Protocol

from deltastream.daemon.observability.redaction import Redactor, redact
from deltastream.errors import InvalidArgumentError

__all__ = [
    "LOG_FORMATS",
    "LOG_LEVELS",
    "LOG_SUMMARY_INTERVAL",
    "JsonFormatter",
    "LogStream",
    "configure_logging",
    "record_fields",
]

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
#: Seconds between a stream's summary lines (``[server] log_summary_interval``,
#: ``--log-summary-every``; 0: none), unless configured.
LOG_SUMMARY_INTERVAL = 60.0

#: A line's own keys: structured fields of the same names do not replace them.
_CORE_KEYS = ("time", "level", "logger", "message", "exception")
#: The attributes every log record has: anything else on a record came in ``extra=``.
_RECORD_ATTRIBUTES = frozenset(
    [*vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None)), "message", "asctime"]
)


def record_fields(record: logging.LogRecord) -> dict[str, object]:
    """The structured fields a log call passed with ``extra=``."""
    return {
        key: value
        for key, value in vars(record).items()
        if key not in _RECORD_ATTRIBUTES and key not in _CORE_KEYS and not key.startswith("_")
    }


def _json_value(value: object) -> object:
    """``value`` as JSON can hold it; text redacted like the message (a field may hold a URL
    or an error's text)."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    return redact(value if isinstance(value, str) else str(value))


class JsonFormatter(logging.Formatter):
    """``{"time": ..., "level": ..., "logger": ..., "message": ..., <fields>}`` (+
    ``exception``): one object per line, the structured fields of the call as top-level
    keys."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": dt.datetime.fromtimestamp(record.created, tz=dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record_fields(record).items():
            entry[key] = _json_value(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


class LogStream(Protocol):
    """Where log lines go: stderr, or the progress bar's stream in front of it."""

    def write(self, text: str, /) -> object: ...

    def flush(self) -> object: ...


def configure_logging(
    fmt: str = "text", level: str = "info", stream: LogStream | None = None
) -> None:
    """Send ``deltastream``'s logs to ``stream`` (default stderr) in ``fmt``."""
    if fmt not in LOG_FORMATS:
        raise InvalidArgumentError(f"log format must be one of {LOG_FORMATS}, not {fmt!r}")
    if level.lower() not in LOG_LEVELS:
        raise InvalidArgumentError(f"log level must be one of {LOG_LEVELS}, not {level!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(Redactor())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("deltastream")
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False
