"""Log output for the daemon: human-readable text lines or one JSON object per line, with
credentials redacted (:mod:`deltastream.daemon.redaction`)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from typing import TextIO

from deltastream.daemon.redaction import Redactor
from deltastream.errors import InvalidArgumentError

__all__ = ["LOG_FORMATS", "JsonFormatter", "configure_logging"]

LOG_FORMATS = ("text", "json")
_LEVELS = ("debug", "info", "warning", "error")


class JsonFormatter(logging.Formatter):
    """``{"time": ..., "level": ..., "logger": ..., "message": ...}`` (+ ``exception``)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": dt.datetime.fromtimestamp(record.created, tz=dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(fmt: str = "text", level: str = "info", stream: TextIO | None = None) -> None:
    """Send ``deltastream``'s logs to ``stream`` (default stderr) in ``fmt``."""
    if fmt not in LOG_FORMATS:
        raise InvalidArgumentError(f"log format must be one of {LOG_FORMATS}, not {fmt!r}")
    if level.lower() not in _LEVELS:
        raise InvalidArgumentError(f"log level must be one of {_LEVELS}, not {level!r}")
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
