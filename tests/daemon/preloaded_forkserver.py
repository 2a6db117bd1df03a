"""The one forkserver the daemon tests fork their short-lived children from: crash-point
runs (``crashpoint_child``) and the crash soak's killed ``serve`` runs (``crashsoak``).

A Python process has a single forkserver, started with the preload list set before it
first runs, so the list lives here, once, for every module that forks from it. A child
forked from it starts in tens of milliseconds with deltastream, pyarrow, deltalake and
psycopg already imported, where a new interpreter takes 1-2 s of CPU (several on a loaded
machine).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver

__all__ = ["PRELOAD", "context"]

#: What the forkserver imports once, so that no child does: the modules whose functions the
#: children run; the tailer, sinks and reset a crash-point run uses; the CLI and what
#: ``serve`` imports only once it runs (seen in ``sys.modules`` of a forked daemon: the
#: metrics and HTTP server's aiohttp and prometheus_client, inotify, pyarrow's acero,
#: deltalake's file systems); and what either would import for itself each time (measured:
#: about 30 ms of a jsonl crash-point run's 90; the delta and PostgreSQL sinks' clients more).
PRELOAD = [
    "crashpoint_child",
    "crashsoak",
    "deltastream.cli",
    "deltastream.daemon.service.server",
    "deltastream.daemon.observability.metrics_exposition",
    "deltastream.storage.inotify",
    "deltastream.daemon.sinks",
    "deltastream.daemon.stream.tailer",
    "deltastream.daemon.stream.reset",
    "anyio._backends._asyncio",
    "anyio._core._signals",
    "pyarrow.acero",
    "pyarrow.dataset",
    "pyarrow.parquet",
    "deltalake",
    "deltalake.fs",
    "psycopg",
]

_context: multiprocessing.context.ForkServerContext | None = None


def context(*, start: bool = False) -> multiprocessing.context.ForkServerContext:
    """The forkserver context, its preload list set; ``start``: start the forkserver now if
    it is not running (it imports its modules meanwhile: about a second), rather than at
    the first fork."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    if start:
        multiprocessing.forkserver.ensure_running()
    return _context
