"""Start-up checks of a service's configuration: what can be found wrong before any stream
starts, so that ``tail`` and ``serve`` fail at once with one line (exit 2) instead of a
stream retrying for ever.

:func:`check_service` checks, for every stream, that its sink spec names a sink, that its
local state directory and its file sink's directory can be created and written (a probe
file is created and removed), the exec sinks' ``work_dir`` likewise, and that the HTTP
address is well formed and can be bound. Locations on S3 are left to the streams: a bucket
that does not answer now may answer later, and is retried like any storage error.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from deltastream.daemon.delivery import Sink
from deltastream.daemon.service.address import check_bindable
from deltastream.daemon.service.supervisor import ServiceConfig, StreamConfig
from deltastream.daemon.sinks import JsonlSink, ParquetSink, parse_sink
from deltastream.errors import InvalidArgumentError
from deltastream.storage import LocalStore, open_store
from deltastream.storage.paths import store_kind

__all__ = ["check_service", "check_writable_directory"]


def check_service(config: ServiceConfig, sinks: Mapping[str, Sink] | None = None) -> None:
    """Raise :class:`~deltastream.errors.InvalidArgumentError` naming the first location or
    address of ``config`` that cannot be used (``sinks``: sinks given as objects, by stream
    name, checked instead of their specs). Creates missing local directories, as the
    streams would."""
    if config.http_address is not None:  # first: it creates nothing
        check_bindable(config.http_address)
    given = sinks or {}
    if config.work_dir:
        check_writable_directory(_local(config.work_dir), "work_dir (the exec sinks' batch files)")
    for stream in config.streams:
        _check_stream(stream, given.get(stream.tail.name))


def _check_stream(stream: StreamConfig, sink: Sink | None) -> None:
    tail = stream.tail
    name = tail.name
    if store_kind(tail.state) == "file":
        # open_store refuses storage options for a local path, and resolves the path as the
        # stream's state store will.
        state = open_store(tail.state, tail.resolved_state_options)
        assert isinstance(state, LocalStore)
        check_writable_directory(state.root, f"the state directory of stream {name!r}")
    if sink is None:
        sink = parse_sink(stream.sink, table=name, stream=tail)
    if isinstance(sink, JsonlSink) and sink.path is not None:
        path = _local(sink.path)
        if path.is_dir():
            raise InvalidArgumentError(
                f"{path}: the output of stream {name!r} ({sink.description}) is a "
                "directory; a jsonl sink writes a file"
            )
        check_writable_directory(path.parent, f"the directory of the output of stream {name!r}")
    elif isinstance(sink, ParquetSink):
        check_writable_directory(_local(sink.directory), f"the output directory of stream {name!r}")


def _local(path: str | os.PathLike[str]) -> Path:
    """A local path as messages show it: absolute, ``~``, ``.`` and ``..`` resolved."""
    return Path(os.path.abspath(os.path.expanduser(path)))


def check_writable_directory(path: Path, what: str) -> None:
    """Create ``path`` (and its parents) if missing and write and remove a hidden probe
    file in it; :class:`~deltastream.errors.InvalidArgumentError` naming ``what`` the
    directory is for if that fails."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".deltastream-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except FileExistsError:
        raise InvalidArgumentError(
            f"{path}: cannot use as {what}: it is a file, not a directory"
        ) from None
    except OSError as e:
        raise InvalidArgumentError(f"{path}: cannot use as {what}: {e.strerror or e}") from None
