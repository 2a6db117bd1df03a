"""The process a crash-point test starts, and stops at a crash point: one tailer, one sink
(or, for ``action="reset"``, one reset of the stream).

Children are forked from a forkserver that has imported deltastream once, so a run costs
tens of milliseconds rather than an interpreter start. Each child arms the crash point
through the environment variable (read the first time a point is passed), follows the table
with a small ``max_rows_per_delivery`` (so that crashes land inside versions and snapshots)
and exits 0 when done, :data:`~deltastream.daemon.crashpoints.CRASH_EXIT_STATUS` at the
crash, or 1 (with a traceback on stderr, and the error's class and message in the job's
``error_file`` if it names one) on any error.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import traceback
from dataclasses import dataclass
from typing import Any

import anyio
import preloaded_forkserver

from deltastream.daemon.crashpoints import CRASH_ENV
from deltastream.daemon.delivery import Delivery, Sink
from deltastream.daemon.sinks import CallbackSink, parse_sink
from deltastream.daemon.stream.reset import reset_stream
from deltastream.daemon.stream.tailer import Mode, StartFrom, TailConfig, Tailer

__all__ = ["CALLBACK", "Job", "change_tuple", "run_job", "start_job", "wait_job"]

#: A sink spec prefix for a callback sink that appends each delivery to a file.
CALLBACK = "callback:"
STREAM = "s"
ROWS_PER_DELIVERY = 4


@dataclass(frozen=True)
class Job:
    uri: str
    state: str
    sink: str
    mode: str
    start: str
    #: Follow mode: stop once every version up to this one is delivered.
    latest: int
    crash: str = ""
    #: ``tail`` (follow the table) or ``reset`` (reset the stream).
    action: str = "tail"
    #: Where to write ``{"class": …, "message": …}`` of the error a failing run raises.
    error_file: str = ""
    #: The stream's ``max_rows_per_delivery`` (``None``: the sink's own).
    rows_per_delivery: int | None = ROWS_PER_DELIVERY
    #: The stream's name.
    name: str = STREAM


def change_tuple(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["_commit_version"], row["_change_type"], row["id"], row["name"], row["part"])


class _Recorder:
    """The callback: one JSON line per delivery (key and rows), flushed and fsynced."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, delivery: Delivery) -> None:
        rows = [list(change_tuple(r)) for b in delivery.batches for r in b.to_pylist()]
        line = json.dumps({"key": delivery.idempotency_key, "rows": rows}) + "\n"
        with open(self.path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def _sink(spec: str, name: str = STREAM) -> Sink:
    if spec.startswith(CALLBACK):
        return CallbackSink(_Recorder(spec.removeprefix(CALLBACK)), description=spec)
    return parse_sink(spec, table=name)


async def _main(job: Job) -> None:
    if job.action == "reset":
        async with _sink(job.sink, job.name) as sink:
            await reset_stream(job.name, sink, job.state)
        return
    config = TailConfig(
        name=job.name,
        uri=job.uri,
        state=job.state,
        mode=Mode(job.mode),
        start=StartFrom.parse(job.start),
        poll_interval=0.02,
        poll_jitter=0.0,
        notifications=False,
        max_rows_per_delivery=job.rows_per_delivery,
        checkpoint_every_versions=1,
    )
    sink = _sink(job.sink, job.name)
    tailer = Tailer(config, sink)

    async def stop_when_caught_up() -> None:
        while True:
            position = tailer.position
            if position is not None and not position.snapshot and position.version > job.latest:
                tailer.stop()
                return
            await anyio.sleep(0.005)

    try:
        async with anyio.create_task_group() as tg:
            if config.mode is not Mode.SNAPSHOT:
                tg.start_soon(stop_when_caught_up)
            await tailer.run()
            tg.cancel_scope.cancel()
    finally:
        await sink.aclose()


def _child(job: Job) -> None:
    os.environ[CRASH_ENV] = job.crash
    try:
        anyio.run(_main, job)
    except BaseException as e:
        traceback.print_exc()
        sys.stderr.flush()
        if job.error_file:
            error: BaseException = e
            while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
                error = error.exceptions[0]  # what a task group wraps
            with open(job.error_file, "w") as f:
                json.dump({"class": type(error).__name__, "message": str(error)}, f)
        os._exit(1)
    os._exit(0)


def start_job(job: Job) -> multiprocessing.process.BaseProcess:
    """Start ``job`` in a child process (see :func:`run_job`) and return it, running."""
    process = preloaded_forkserver.context().Process(target=_child, args=(job,))
    process.start()
    return process


def wait_job(process: multiprocessing.process.BaseProcess, job: Job, timeout: float = 60.0) -> int:
    """Wait for a job's process to end; its exit status (killed after ``timeout``)."""
    process.join(timeout)
    if process.exitcode is None:
        process.kill()
        process.join()
        raise TimeoutError(f"{job} did not finish within {timeout}s")
    return process.exitcode


def run_job(job: Job, timeout: float = 60.0) -> int:
    """Run ``job`` in a child process; its exit status."""
    return wait_job(start_job(job), job, timeout)
