"""The ``exec:COMMAND`` sink: writes each delivery to a parquet file and runs a shell
command on it in its own process group, retried with backoff; at-least-once.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.abc
import anyio.to_thread

from deltastream.daemon.crashpoints import crash_point
from deltastream.daemon.delivery import Delivery, Guarantee, Position, Sink, StreamRef
from deltastream.daemon.sinks.common import (
    _TOKEN,
    SPEC_FORMS,
    _check_retry_options,
    _check_table_name,
    _unlink_quietly,
    _write_parquet_atomically,
    log,
)
from deltastream.errors import InvalidArgumentError, SinkError
from deltastream.storage.local import temp_target
from deltastream.storage.retry import RetryEvent, RetryPolicy, call_with_retries

#: Seconds each run of the command may take before its process group is killed and the run
#: retried (``--exec-timeout``, ``ExecSink(timeout=)``): a hung command must not hold a
#: stream for ever, and an ETL job rarely needs more than minutes.
EXEC_TIMEOUT: Final = 300.0


def _exec_batch_name(delivery: Delivery) -> str:
    return f"{delivery.table}-{delivery.start.token}-{delivery.end.token}.parquet"


class _CommandFailed(Exception):
    """A run of the command that failed (``failure`` says how), with the last lines of its
    standard error (``tail``)."""

    def __init__(self, failure: str, tail: list[str]) -> None:
        super().__init__(failure)
        self.failure = failure
        self.tail = tail

    @property
    def stderr(self) -> str:
        return "\n".join(self.tail)

    @property
    def detail(self) -> str:
        """The stderr tail, to end a message with (nothing if it is empty)."""
        stderr = self.stderr
        return f"; last lines of stderr:\n{stderr}" if stderr else ""


def _transient_cause(error: BaseException) -> str | None:
    """A failed run in one line (the failure, and the last line of stderr): worth retrying.
    None for anything else (the command could not be started, the delivery was cancelled)."""
    if isinstance(error, _CommandFailed):
        return f"{error.failure}; stderr: {error.tail[-1]}" if error.tail else error.failure
    return None


class ExecSink(Sink):
    """Runs a command once per delivery (``exec:COMMAND``), to trigger ETL jobs.

    The rows are written to a parquet file in ``work_dir`` (default: a temporary directory,
    removed by :meth:`aclose`), then ``/bin/sh -c COMMAND`` runs with the inherited
    environment plus ``env`` and ``DELTASTREAM_TABLE``, ``DELTASTREAM_TABLE_URI``,
    ``DELTASTREAM_TABLE_ID``, ``DELTASTREAM_FROM_VERSION``, ``DELTASTREAM_TO_VERSION``,
    ``DELTASTREAM_BATCH_PATH`` (the parquet file), ``DELTASTREAM_ROWS``,
    ``DELTASTREAM_IDEMPOTENCY_KEY`` and ``DELTASTREAM_EPOCH`` (the stream's epoch in this
    process, :attr:`~deltastream.daemon.delivery.Delivery.epoch`: a job that records the
    highest it has seen can refuse a lower one, from a process that lost the stream). Exit
    status 0 acknowledges (the file is then deleted);
    anything else, or running longer than ``timeout`` seconds (default
    :data:`EXEC_TIMEOUT`, the ``exec_timeout`` setting;
    ``None``: no bound), is logged with the last ``stderr_lines`` lines of the command's
    standard error and retried with backoff, forever unless ``max_attempts`` is set. The
    command's standard output goes to the daemon's standard error (standard output may carry
    a ``jsonl:-`` stream).

    The command runs in its own process group. If the delivery is cancelled (shutdown) or
    times out, the whole group gets SIGTERM, then SIGKILL after ``kill_grace`` seconds, and
    the shell is waited for before :meth:`deliver` returns. At-least-once.
    """

    guarantee: Guarantee = "at-least-once"

    def __init__(
        self,
        command: str,
        *,
        work_dir: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = EXEC_TIMEOUT,
        max_attempts: int | None = None,
        base_delay: float = 1.0,
        max_delay: float = 60.0,
        kill_grace: float = 10.0,
        stderr_lines: int = 20,
    ) -> None:
        if not command.strip():
            raise InvalidArgumentError(f"exec sink needs a command; accepted: {SPEC_FORMS}")
        _check_retry_options(max_attempts, base_delay, max_delay)
        if timeout is not None and timeout <= 0:
            raise InvalidArgumentError(f"timeout must be positive, not {timeout}")
        self.command = command
        self.env = dict(env or {})
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.kill_grace = kill_grace
        self.stderr_lines = max(1, stderr_lines)
        self._work_dir = None if work_dir is None else Path(work_dir).expanduser()
        self._own_work_dir: Path | None = None
        self._cleaned: set[str] = set()
        #: Failed runs that were retried, for tests and metrics.
        self.retries = 0

    @property
    def description(self) -> str:
        return f"exec:{self.command}"

    @property
    def work_dir(self) -> Path:
        """Where batch files are written (created on first use)."""
        if self._work_dir is None:
            self._own_work_dir = Path(tempfile.mkdtemp(prefix="deltastream-exec-"))
            self._work_dir = self._own_work_dir
        return self._work_dir

    async def recover(
        self, stream: StreamRef, committed: Position | None, state: Mapping[str, Any]
    ) -> None:
        """Nothing to undo: the command sees repeated rows (at-least-once). Batch files a
        crash left in the work directory are removed at the stream's first delivery."""

    def _remove_stale_batches(self, table: str) -> None:
        if not self.work_dir.is_dir():
            return
        pattern = re.compile(rf"{re.escape(table)}-{_TOKEN}-{_TOKEN}\.parquet")
        with os.scandir(self.work_dir) as entries:
            for entry in entries:
                target = temp_target(entry.name)
                if pattern.fullmatch(target if target is not None else entry.name):
                    _unlink_quietly(entry.path)

    def _environment(self, delivery: Delivery, batch_path: Path) -> dict[str, str]:
        return {
            **os.environ,
            **self.env,
            "DELTASTREAM_TABLE": delivery.table,
            "DELTASTREAM_TABLE_URI": delivery.table_uri,
            "DELTASTREAM_TABLE_ID": delivery.table_id,
            "DELTASTREAM_FROM_VERSION": str(delivery.from_version),
            "DELTASTREAM_TO_VERSION": str(delivery.to_version),
            "DELTASTREAM_BATCH_PATH": str(batch_path),
            "DELTASTREAM_ROWS": str(delivery.num_rows),
            "DELTASTREAM_IDEMPOTENCY_KEY": delivery.idempotency_key,
            "DELTASTREAM_EPOCH": str(delivery.epoch),
        }

    async def deliver(self, delivery: Delivery) -> Mapping[str, Any]:
        if not delivery.num_rows:
            return {}
        table = _check_table_name(delivery.table)
        if table not in self._cleaned:
            await anyio.to_thread.run_sync(self._remove_stale_batches, table)
            self._cleaned.add(table)
        batch_path = self.work_dir / _exec_batch_name(delivery)
        await anyio.to_thread.run_sync(
            lambda: _write_parquet_atomically(delivery, batch_path, durable=False)
        )
        env = self._environment(delivery, batch_path)
        what = f"{delivery.num_rows} rows of {table} ({delivery.start} to {delivery.end})"
        last: list[_CommandFailed] = []  # the last failed run, for the retry's report

        async def run() -> Mapping[str, Any]:
            failure, tail = await self._run_once(env)
            if failure is not None:
                last[:] = [_CommandFailed(failure, tail)]
                raise last[0]
            if tail:
                log.debug("%s: stderr:\n%s", self.description, "\n".join(tail))
            crash_point("sink.after-write")
            return {}

        def give_up(error: BaseException, attempts: int, cause: str) -> SinkError:
            assert isinstance(error, _CommandFailed)
            return SinkError(
                self.description,
                f"failed for {what} after {attempts} attempt(s): {error.failure}{error.detail}",
            )

        def counted() -> None:
            self.retries += 1

        def reported(event: RetryEvent) -> None:
            failed = last[0]
            if self.retry_listener is not None:
                # The listener logs the one warning; its cause keeps to one line, so the
                # stderr tail goes to an info line of its own.
                self.retry_listener(event)
                if failed.stderr:
                    log.info("%s: last lines of stderr:\n%s", self.description, failed.stderr)
            else:
                log.warning(
                    "%s: %s for %s (attempt %d); retrying in %.1fs%s",
                    self.description,
                    failed.failure,
                    what,
                    event.attempt,
                    event.delay,
                    failed.detail,
                )

        try:
            return await call_with_retries(
                run,
                operation="exec",
                target=self.command,
                policy=RetryPolicy(
                    self.max_attempts or sys.maxsize, self.base_delay, self.max_delay
                ),
                transient=_transient_cause,
                listener=reported,
                on_retry=counted,
                give_up=give_up,
            )
        finally:
            _unlink_quietly(batch_path)

    async def _run_once(self, env: Mapping[str, str]) -> tuple[str | None, list[str]]:
        """Run the command once: ``(None, stderr tail)`` if it exited 0, else a description
        of the failure with the tail."""
        tail: deque[str] = deque(maxlen=self.stderr_lines)
        # Shielded: a cancellation (shutdown) landing as the process starts would otherwise
        # drop it unseen, its group never stopped; now it lands inside the ``try`` below.
        with anyio.CancelScope(shield=True):
            process = await anyio.open_process(
                ["/bin/sh", "-c", self.command],
                stdin=subprocess.DEVNULL,
                stdout=2,  # the daemon's standard error
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,  # its own process group, so all of it can be stopped
            )
        code: int | None = None
        try:
            with anyio.move_on_after(self.timeout):
                async with anyio.create_task_group() as tg:
                    drained = anyio.Event()
                    tg.start_soon(self._drain, process, tail, drained)
                    code = await process.wait()
                    # A background child may hold stderr open: don't wait for it forever.
                    with anyio.move_on_after(1.0):
                        await drained.wait()
                    tg.cancel_scope.cancel()
            if code is None:
                with anyio.CancelScope(shield=True):
                    await self._terminate(process)
                return (
                    f"timed out after {self.timeout:g}s; its process group was killed",
                    list(tail),
                )
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._terminate(process)
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await process.aclose()
        if code == 0:
            return None, list(tail)
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = str(-code)
            return f"command was killed by {name}", list(tail)
        return f"command exited with status {code}", list(tail)

    @staticmethod
    async def _drain(process: anyio.abc.Process, tail: deque[str], drained: anyio.Event) -> None:
        stream = process.stderr
        partial = b""
        try:
            if stream is None:
                return
            with contextlib.suppress(
                anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError
            ):
                async for chunk in stream:
                    *lines, partial = (partial + chunk).split(b"\n")
                    partial = partial[-4096:]
                    tail.extend(line.decode("utf-8", "replace")[:1000] for line in lines)
            if partial:
                tail.append(partial.decode("utf-8", "replace")[:1000])
        finally:
            drained.set()

    async def _terminate(self, process: anyio.abc.Process) -> None:
        """SIGTERM the command's process group, give it ``kill_grace`` seconds to exit (the
        shell and everything it started), SIGKILL what is left, and reap the shell. Must run
        shielded."""
        group = process.pid  # start_new_session: the shell leads its own group

        def signal_group(sig: int) -> bool:
            """Send ``sig`` to the group; whether it still had members."""
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                return False
            except PermissionError:  # a member changed its credentials: still there
                return True
            return True

        if signal_group(signal.SIGTERM):
            with anyio.move_on_after(self.kill_grace):
                await process.wait()
                # The shell is gone; wait for what it started. Nothing signals when a
                # process group empties, so poll.
                while signal_group(0):  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            if signal_group(signal.SIGKILL):
                # SIGKILL takes effect asynchronously; zombies nobody reaps would count as
                # members for ever, hence the bound.
                with anyio.move_on_after(1.0):
                    await process.wait()
                    while signal_group(0):  # noqa: ASYNC110
                        await anyio.sleep(0.01)
        await process.wait()

    async def aclose(self) -> None:
        own, self._own_work_dir = self._own_work_dir, None
        if own is not None:
            self._work_dir = None
            await anyio.to_thread.run_sync(lambda: shutil.rmtree(own, ignore_errors=True))
