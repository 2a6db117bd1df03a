"""Running deltastream's async code for synchronous callers: the one way every synchronous
entry point (:func:`~deltastream.read_snapshot`, :func:`~deltastream.read_rows`,
:func:`~deltastream.read_changes`, the Spark reader's partitions) does it.

A synchronous call must work wherever it is made: in a script, where no event loop runs, and
in code that already runs one in the calling thread (a Jupyter kernel runs every cell inside
its asyncio loop; so does any async program calling a synchronous library), where
``anyio.run`` refuses to start a second loop. So the async code always runs on an event loop
of its own, in a thread of its own (:func:`start_loop_thread`): :func:`run_sync` waits for
its result, and a stream hands its batches over as they come
(:func:`~deltastream.read.batch_stream.to_record_batch_reader`).

The thread is a daemon thread with a fresh context (none of the caller's context variables,
which include the caller's event loop library): an interrupted caller (Ctrl-C) returns at
once, and what the thread was doing finishes in the background and is discarded.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

__all__ = ["run_sync", "start_loop_thread"]

T = TypeVar("T")


def start_loop_thread(main: Callable[[], Awaitable[None]], name: str) -> threading.Thread:
    """Start running ``main`` on an event loop of its own in a new (daemon) thread."""
    thread = threading.Thread(target=anyio.run, args=(main,), name=name, daemon=True)
    thread.start()
    return thread


def run_sync(fn: Callable[[], Awaitable[T]]) -> T:
    """What ``await fn()`` returns (or raises), for a synchronous caller, whether or not the
    calling thread runs an event loop."""
    results: list[T] = []
    errors: list[BaseException] = []

    async def main() -> None:
        try:
            results.append(await fn())
        except BaseException as e:  # handed to the caller, in its thread
            errors.append(e)

    start_loop_thread(main, "deltastream-sync").join()
    if errors:
        raise errors[0]
    return results[0]
