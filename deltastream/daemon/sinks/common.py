"""What several sinks share: the spec forms for error messages, the logger, retry-option
and stream-name checks, writing a parquet file atomically (hidden temporary file, fsync,
rename) and recognising those temporary files, turning the ``OSError`` of a write (a full
disk, a permission) into a :class:`~deltastream.errors.StorageError` naming the file, the
position-token pattern in file names, the ``deltastream reset`` hint recovery errors end
with, and reading ``${NAME}`` environment variables in settings that hold credentials
(:func:`expand_env`: the http sink's headers, a PostgreSQL spec), and the error of a
process fenced off a stream's target (:func:`_fenced`).

Private to :mod:`deltastream.daemon.sinks`: its modules import these names from here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Final

import pyarrow.parquet as pq

from deltastream.daemon.crashpoints import crash_point
from deltastream.daemon.delivery import STREAM_NAME, Delivery, StreamRef
from deltastream.errors import InvalidArgumentError, SinkFencedError, StorageError
from deltastream.output import create_temp_file
from deltastream.storage.local import fsync_path, temp_name_parts

#: One logger for the whole package, named as when the sinks were one module, so that log
#: output and log configuration do not depend on which module a sink lives in.
log = logging.getLogger("deltastream.daemon.sinks")

#: The spec forms :func:`parse_sink` accepts, for error messages and help texts.
SPEC_FORMS: Final = (
    "jsonl:PATH, jsonl:- (standard output), parquet:DIRECTORY, http://URL, https://URL, "
    "exec:COMMAND, delta:URI, delta:URI?mode=merge&key=COLUMN[,COLUMN...], "
    "postgresql://USER@HOST:PORT/DB?table=NAME[&mode=merge&key=COLUMN,...]"
)


def _check_retry_options(max_attempts: int | None, base_delay: float, max_delay: float) -> None:
    if max_attempts is not None and max_attempts < 1:
        raise InvalidArgumentError(f"max_attempts must be at least 1 (or None), not {max_attempts}")
    if base_delay < 0 or max_delay < 0:
        raise InvalidArgumentError(
            f"retry delays must not be negative (base {base_delay}, max {max_delay})"
        )


#: ``${NAME}`` in a setting's value: the environment variable NAME.
_ENV_REFERENCE = re.compile(r"\$\{([^}]*)\}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def expand_env(text: str, what: str) -> str:
    """``text`` with each ``${NAME}`` replaced by the environment variable NAME; an unset
    variable or a malformed reference is an error naming it and ``what`` holds it (never the
    text, which may hold a secret). For the settings of sinks that may hold credentials: the
    http sink's headers, a PostgreSQL spec."""

    def value(m: re.Match[str]) -> str:
        name = m[1]
        if not _ENV_NAME.fullmatch(name):
            raise InvalidArgumentError(f"{what}: ${{{name}}} is not an environment variable name")
        if name not in os.environ:
            raise InvalidArgumentError(f"{what}: environment variable {name!r} is not set")
        return os.environ[name]

    expanded = _ENV_REFERENCE.sub(value, text)
    if "${" in _ENV_REFERENCE.sub("", text):
        raise InvalidArgumentError(f"{what}: '${{' without a closing '}}'")
    return expanded


def _unlink_quietly(path: str | Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


@contextlib.contextmanager
def _writing(path: str | Path) -> Iterator[None]:
    """Raise an ``OSError`` of writing ``path`` as a :class:`StorageError` naming it: the
    OS's own (``[Errno 28] No space left on device``) often names no file, and is then no
    use in a log. Transient: space may be freed, a permission fixed."""
    try:
        yield
    except StorageError:
        raise  # already names its file
    except OSError as e:
        # pyarrow's OSErrors carry no strerror: their text says it all.
        raise StorageError(str(path), f"cannot write: {e.strerror or e}") from e


def _write_parquet_atomically(
    delivery: Delivery,
    target: Path,
    *,
    durable: bool,
    metadata: Mapping[bytes, bytes] | None = None,
) -> None:
    """Write the delivery's rows to ``target`` through a hidden temporary file beside it
    (``.{name}.XXXXXXXX.tmp``), renamed into place once complete (and, if ``durable``,
    fsynced first, with the directory fsynced after: then it passes the crash points
    ``sink.after-write`` and ``sink.after-fsync``). ``metadata``: added to the schema's
    key-value metadata in the file's footer. An ``OSError`` is raised as a
    :class:`StorageError` naming ``target``."""
    with _writing(target):
        _write_parquet_file(delivery, target, durable=durable, metadata=metadata)


def _write_parquet_file(
    delivery: Delivery,
    target: Path,
    *,
    durable: bool,
    metadata: Mapping[bytes, bytes] | None = None,
) -> None:
    directory = target.parent
    directory.mkdir(parents=True, exist_ok=True)
    schema = delivery.schema
    if metadata:
        schema = schema.with_metadata({**(schema.metadata or {}), **metadata})
    # Readable as the umask allows, like the jsonl sink's files (mkstemp would make it 0600).
    tmp = create_temp_file(directory, *temp_name_parts(target.name))
    try:
        with pq.ParquetWriter(tmp, schema) as writer:
            for batch in delivery.batches:
                if batch.num_rows:
                    writer.write_batch(batch)
        if durable:
            crash_point("sink.after-write")
            fsync_path(tmp)
        os.replace(tmp, target)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    if durable:
        try:
            fsync_path(directory)
        except BaseException:
            # Not known to be durable, so not delivered: leave nothing a retry could duplicate.
            _unlink_quietly(target)
            raise
        crash_point("sink.after-fsync")


def _check_table_name(table: str) -> str:
    if not re.fullmatch(STREAM_NAME, table):
        raise InvalidArgumentError(
            f"stream name {table!r} cannot name files: use letters, digits, '-', '_' and '.'"
        )
    return table


#: A position's token (:attr:`Position.token`), as file names hold it.
_TOKEN = r"\d{20}[sc]\d{12}"


def _reset_hint(stream: StreamRef, spec: str) -> str:
    return f"to discard the stream's output and start over: {stream.reset_command(spec)}"


def _fenced(
    sink: str, stream: str | None, where: str, epoch: int, mine: int, when: str = ""
) -> SinkFencedError:
    """The error of a process fenced off a stream's target: ``where`` (the table, the
    offsets row) holds the stream's ``epoch``, newer than this process's (``mine``)."""
    return SinkFencedError(
        sink,
        f"another process took stream {stream!r} over{' ' + when if when else ''}: {where} "
        f"holds its epoch {epoch}, and this process's is {mine}; nothing was committed, and "
        "this process gives the stream up",
        mine,
    )
