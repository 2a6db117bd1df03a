"""Helpers for tailer tests: tables written by deltalake, a writer that keeps committing,
running a tailer until it has delivered a version, and the expected change rows (delta-rs's
``load_cdf``, the independent oracle)."""

from __future__ import annotations

import itertools
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
from deltalake import DeltaTable, WriterProperties, write_deltalake

from deltastream.daemon.delivery import Delivery, Position
from deltastream.daemon.service.supervisor import StreamConfig
from deltastream.daemon.sinks import CallbackSink
from deltastream.daemon.stream.config import Mode, StartFrom
from deltastream.daemon.stream.tailer import TailConfig, Tailer

__all__ = [
    "CDF",
    "SMALL_GROUPS",
    "Collector",
    "Writer",
    "batch",
    "change_key",
    "create_table",
    "deliver_through",
    "eventually",
    "expected_changes",
    "fast",
    "run_tailer_until",
    "small_deliveries",
    "wait_for_output",
]

CDF = {"delta.enableChangeDataFeed": "true"}
#: 4-row row groups: the reader yields 4-row batches, so small deliveries split versions.
SMALL_GROUPS = WriterProperties(
    max_row_group_size=4, write_batch_size=4, data_page_row_count_limit=4
)
#: Columns identifying a change row (``_commit_timestamp`` is left out: delta-rs takes it
#: from ``commitInfo``, deltastream from the protocol's rule).
Row = tuple[Any, ...]


def batch(ids: Iterable[int], name: str = "x") -> pa.Table:
    ids = list(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"{name}{i}" for i in ids]),
            "part": pa.array([f"p{i % 3}" for i in ids]),
        }
    )


def create_table(
    uri: str, rows: int = 10, storage_options: Mapping[str, str] | None = None
) -> None:
    write_deltalake(
        uri,
        batch(range(rows)),
        partition_by=["part"],
        configuration=CDF,
        storage_options=dict(storage_options) if storage_options else None,
    )


def change_key(row: Mapping[str, Any], columns: Iterable[str] = ("id", "name", "part")) -> Row:
    return (row["_commit_version"], row["_change_type"], *(row.get(c) for c in columns))


def expected_changes(
    uri: str,
    start: int,
    end: int,
    storage_options: Mapping[str, str] | None = None,
    columns: Iterable[str] = ("id", "name", "part"),
) -> Counter[Row]:
    table = DeltaTable(uri, storage_options=dict(storage_options) if storage_options else None)
    cdf = pa.table(table.load_cdf(starting_version=start, ending_version=end))
    columns = tuple(columns)
    return Counter(change_key(r, columns) for r in cdf.to_pylist())


@dataclass
class Collector:
    """A callback sink's function: keeps every delivered row and delivery."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)

    def __call__(self, delivery: Delivery) -> None:
        self.deliveries.append(delivery)
        for b in delivery.batches:
            self.rows.extend(b.to_pylist())

    def sink(self) -> CallbackSink:
        return CallbackSink(self, description="test:collector")

    def counter(self, columns: Iterable[str] = ("id", "name", "part")) -> Counter[Row]:
        columns = tuple(columns)
        return Counter(change_key(r, columns) for r in self.rows)


class Writer:
    """Commits appends, updates, deletes and merges to a table from a thread.

    ``kinds`` is the cycle of operations, step ``n`` doing ``kinds[n % len(kinds)]``; besides
    the four writes there are ``"optimize"`` (compaction, a ``dataChange=false`` commit, or
    none when there is nothing to compact) and ``"checkpoint"`` (a Delta checkpoint of the
    latest version, no commit). ``commits`` is the number of steps, or None to run until
    :meth:`stop`. ``committed`` notes when each new version was committed (the writer
    being the table's only one): version -> ``time.time()`` when the step's write returned."""

    KINDS: tuple[str, ...] = ("append", "update", "append", "delete", "merge")

    def __init__(
        self,
        uri: str,
        commits: int | None,
        *,
        interval: float = 0.0,
        storage_options: Mapping[str, str] | None = None,
        first_id: int = 1000,
        kinds: Sequence[str] = KINDS,
        allowance: threading.Semaphore | None = None,
    ) -> None:
        unknown = set(kinds) - {"append", "update", "delete", "merge", "optimize", "checkpoint"}
        if unknown or not kinds:
            raise ValueError(f"unknown writer operations {sorted(unknown)} (or none)")
        self.uri = uri
        self.commits = commits
        self.interval = interval
        self.options = dict(storage_options) if storage_options else None
        self.next_id = first_id
        self.kinds = tuple(kinds)
        self.steps = 0
        self.done = threading.Event()
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self.last_version = -1
        self.committed: dict[int, float] = {}
        #: When given, each step takes one permit first (the caller paces the writer).
        self.allowance = allowance

    def step(self, n: int) -> None:
        table = DeltaTable(self.uri, storage_options=self.options)
        before = table.version()
        kind = self.kinds[n % len(self.kinds)]
        if kind == "append":
            write_deltalake(table, batch(range(self.next_id, self.next_id + 4)), mode="append")
            self.next_id += 4
        elif kind == "update":
            table.update(predicate=f"id % 4 = {n % 4}", updates={"name": "concat(name, '+')"})
        elif kind == "delete":
            table.delete(f"id % 7 = {n % 7}")
        elif kind == "merge":
            source = batch(range(self.next_id - 2, self.next_id + 2), name="m")
            self.next_id += 2
            (
                table.merge(source, predicate="t.id = s.id", source_alias="s", target_alias="t")
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute()
            )
        elif kind == "optimize":
            table.optimize.compact()
        else:
            table.create_checkpoint()
        returned = time.time()
        self.steps += 1
        self.last_version = DeltaTable(self.uri, storage_options=self.options).version()
        for version in range(before + 1, self.last_version + 1):
            self.committed[version] = returned

    def stop(self) -> None:
        """Make :meth:`run` return after the step under way (no effect once it returned)."""
        self._stop.set()

    def run(self) -> None:
        try:
            for n in itertools.islice(itertools.count(), self.commits):
                if self.allowance is not None:
                    while not self._stop.is_set() and not self.allowance.acquire(timeout=0.05):
                        pass
                if self._stop.is_set():
                    break
                self.step(n)
                if self.interval:
                    self._stop.wait(self.interval)
        except BaseException as e:
            self.error = e
            raise
        finally:
            self.done.set()


async def eventually(condition: Callable[[], bool], within: float = 60.0) -> None:
    """Wait until ``condition()`` holds, checking every 20 ms; fail after ``within`` s."""
    with anyio.fail_after(within):
        for _ in itertools.count():
            if condition():
                return
            await anyio.sleep(0.02)


async def run_tailer_until(
    config: TailConfig,
    sink: Any,
    done: Callable[[Tailer], bool],
    *,
    within: float = 60.0,
    during: Callable[[], Any] | None = None,
) -> Tailer:
    """Run a tailer until ``done(tailer)``, then stop it and wait for it to finish.

    ``during`` (a blocking function, e.g. a writer) runs in a thread meanwhile. The tailer's
    own errors propagate."""
    tailer = Tailer(config, sink)
    async with anyio.create_task_group() as tg:
        tg.start_soon(tailer.run)
        if during is not None:
            await anyio.to_thread.run_sync(during)
        await eventually(lambda: done(tailer), within)
        tailer.stop()
    return tailer


async def deliver_through(config: TailConfig, sink: Any, version: int) -> Tailer:
    """Run a stream into ``sink`` until it has delivered every version up to ``version``,
    then stop it and close the sink. The tailer's own errors propagate."""
    try:
        return await run_tailer_until(
            config, sink, lambda t: (t.position or Position(-1)) >= Position(version + 1)
        )
    finally:
        await sink.aclose()


def fast(config: TailConfig, **changes: Any) -> TailConfig:
    """``config`` with a short poll interval (and other ``changes``)."""
    return replace(config, poll_interval=0.05, **changes)


def follow_stream(tmp_path: Path, name: str, uri: str, sink: str = "test") -> StreamConfig:
    """A service stream following ``uri`` from version 0, polling every 50 ms, its state in
    ``tmp_path/state/name``."""
    tail = TailConfig(
        name=name,
        uri=uri,
        state=str(tmp_path / "state" / name),
        mode=Mode.FOLLOW,
        start=StartFrom(version=0),
        poll_interval=0.05,
    )
    return StreamConfig(tail, sink)


def small_deliveries(uri: str, state: Path, **changes: Any) -> TailConfig:
    """A stream ``s`` following ``uri`` from version 0 into a sink, 3 rows per delivery (so
    versions split), polling every 50 ms without notifications; ``changes`` on top."""
    values: dict[str, Any] = {
        "name": "s",
        "uri": uri,
        "state": str(state),
        "mode": Mode.FOLLOW,
        "start": StartFrom(version=0),
        "poll_interval": 0.05,
        "notifications": False,
        "max_rows_per_delivery": 3,
        **changes,
    }
    return TailConfig(**values)


def wait_for_output(
    proc: subprocess.Popen[Any], path: Path, done: Callable[[str], bool], within: float = 60
) -> None:
    """Wait until ``done(text)`` holds for the text a running process ``proc`` wrote to
    ``path``; fail (showing it) if the process ends or ``within`` seconds pass first."""
    deadline = time.monotonic() + within
    while not done(path.read_text()):
        assert proc.poll() is None, path.read_text()
        assert time.monotonic() < deadline, path.read_text()
        time.sleep(0.05)


async def run_until_delivered(config: TailConfig, collector: Collector, version: int) -> Tailer:
    """Run until every version up to ``version`` is delivered; errors propagate."""
    tailer = Tailer(config, collector.sink())
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            await eventually(
                lambda: tailer.position is not None and tailer.position >= Position(version + 1),
                within=30,
            )
            tailer.stop()

        tg.start_soon(watch)
        await tailer.run()
        tg.cancel_scope.cancel()
    return tailer
