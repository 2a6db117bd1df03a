"""How large a JSON log file deltastream agrees to hold in memory: the one limit and where it
is set.

A commit (or log compaction, or JSON V2 checkpoint) is parsed whole: its file actions become
one Arrow table, and its bytes and parsed actions are in memory together. A log whose writer
went wrong, or a hostile one, could name a file of many gigabytes; such a file is refused
before it is downloaded, with :class:`~deltastream.errors.LogFileTooLargeError` naming the file,
its size, the limit and how to raise it, instead of exhausting memory.

The limit is read from the environment (:data:`MAX_JSON_LOG_BYTES_ENV`), so that every way of
running deltastream (CLI, daemon, Python, a Spark driver) honours one setting.
"""

from __future__ import annotations

import os

from deltastream.errors import InvalidArgumentError, LogFileTooLargeError

__all__ = [
    "DEFAULT_MAX_JSON_LOG_BYTES",
    "MAX_JSON_LOG_BYTES_ENV",
    "check_json_log_size",
    "max_json_log_bytes",
]

#: The environment variable that sets the limit, in bytes.
MAX_JSON_LOG_BYTES_ENV = "DELTASTREAM_MAX_COMMIT_BYTES"

#: 1 GiB: far above commits real writers make (a commit of a million adds with statistics is
#: a few hundred MB), and parsed in a few GB of memory.
DEFAULT_MAX_JSON_LOG_BYTES = 1 << 30


def max_json_log_bytes() -> int:
    """The limit in force: :data:`MAX_JSON_LOG_BYTES_ENV` if set, else the default."""
    raw = os.environ.get(MAX_JSON_LOG_BYTES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_JSON_LOG_BYTES
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        value = 0
    if value <= 0:
        raise InvalidArgumentError(
            f"{MAX_JSON_LOG_BYTES_ENV}={raw!r}: expected a positive number of bytes"
        )
    return value


def check_json_log_size(uri: str, size: int) -> None:
    """Raise :class:`~deltastream.errors.LogFileTooLargeError` if the JSON log file at
    ``uri`` (``size`` bytes, as listed) is over the limit."""
    limit = max_json_log_bytes()
    if size > limit:
        raise LogFileTooLargeError(uri, size, limit, MAX_JSON_LOG_BYTES_ENV)
