"""``deltastream demo``: the main job on an embedded default, with nothing to set up.

It creates a small local Delta table with the change data feed on, keeps committing
appends, updates, deletes and merges to it from a writer thread (``deltalake`` is the
writer, as another engine would be), and tails it: the snapshot first, then each commit's
change rows, printed as they arrive, until Ctrl-C or ``--duration`` seconds.

Its directory (``--path``) holds ``table/`` and ``state/``, which each run replaces, and a
marker file, :data:`MARKER`, written when the demo made the directory its own. A directory
without the marker is refused unless it is empty (or ``--force`` is given): the demo never
deletes anything it did not create, and never writes into a directory someone else uses (a
Delta table's, say) unless told to.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import threading
from pathlib import Path
from typing import Any, TextIO

import anyio
import anyio.to_thread
import pyarrow as pa

from deltastream.daemon.delivery import Delivery
from deltastream.daemon.service.supervisor import Service, single_stream
from deltastream.daemon.sinks import CallbackSink
from deltastream.daemon.stream.tailer import TailConfig
from deltastream.errors import InvalidArgumentError, OutputClosedError
from deltastream.output import json_value

__all__ = ["MARKER", "DemoWriter", "claim_demo_directory", "create_demo_table", "run_demo"]

log = logging.getLogger(__name__)

_COUNTRIES = ["NL", "FR", "JP", "BR"]
_CONFIG = {"delta.enableChangeDataFeed": "true"}
#: The file that marks a directory as the demo's own (so that it may replace what is in it).
MARKER = ".deltastream-demo"
#: What the demo creates in its directory, and replaces on each run.
_CREATED = ("table", "state")


def _deltalake() -> Any:
    try:
        import deltalake
    except ImportError as e:
        raise InvalidArgumentError(
            f"the demo writes its table with the 'deltalake' package ({e}); "
            "install it with: pip install 'deltalake>=1.0' (or, in a checkout: "
            "pip install -e '.[demo]')"
        ) from e
    return deltalake


def _rows(start: int, n: int) -> pa.Table:
    ids = range(start, start + n)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "country": pa.array([_COUNTRIES[i % len(_COUNTRIES)] for i in ids]),
            "amount": pa.array([round(i * 1.5, 2) for i in ids], pa.float64()),
        }
    )


def claim_demo_directory(path: Path, *, force: bool = False) -> Path:
    """Make ``path`` the demo's directory and empty what earlier runs created in it; the
    absolute path.

    A directory that does not exist or is empty is created and marked (:data:`MARKER`); one
    with the marker is the demo's already. Any other directory is refused, unless ``force``:
    then it is marked and used, provided it holds no ``table`` or ``state`` of its own (the
    demo would have to delete them). Only what the marker vouches for is ever deleted.
    """
    root = Path(os.path.abspath(path))
    marker = root / MARKER
    try:
        if root.exists() and not root.is_dir():
            raise InvalidArgumentError(f"{root}: not a directory; choose another --path")
        if not marker.is_file() and root.is_dir() and any(root.iterdir()):
            if not force:
                raise InvalidArgumentError(
                    f"{root}: not a directory the demo created (it is not empty and has no "
                    f"{MARKER} file); choose another --path, or pass --force to use it anyway"
                )
            taken = [name for name in _CREATED if (root / name).exists()]
            if taken:
                raise InvalidArgumentError(
                    f"{root}: already holds {' and '.join(taken)}, which the demo did not "
                    "create and would replace; choose another --path"
                )
        root.mkdir(parents=True, exist_ok=True)
        if not marker.is_file():
            marker.write_text(
                "Created by `deltastream demo`, which replaces table/ and state/ here on "
                "each run.\n"
            )
        for name in _CREATED:
            shutil.rmtree(root / name, ignore_errors=True)
    except OSError as e:
        raise InvalidArgumentError(f"{root}: cannot use for the demo: {e.strerror or e}") from e
    return root


def create_demo_table(path: Path) -> Path:
    """A fresh table at ``path/table`` (``path``: the demo's directory, see
    :func:`claim_demo_directory`), with 12 rows in 2 commits."""
    deltalake = _deltalake()
    root = path.absolute() / "table"
    root.mkdir(parents=True)
    for start in (0, 6):
        deltalake.write_deltalake(
            str(root),
            _rows(start, 6),
            mode="append",
            partition_by=["country"],
            configuration=_CONFIG,
        )
    return root


class DemoWriter:
    """Commits one change every ``interval`` seconds from a background thread: an append,
    an update, a delete and a merge, in turn."""

    def __init__(self, root: Path, interval: float = 1.0) -> None:
        self.root = root
        self.interval = interval
        self.commits = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="deltastream-demo-writer", daemon=True
        )
        self._next_id = 12

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        deltalake = _deltalake()
        steps = itertools.cycle(("append", "update", "delete", "merge"))
        try:
            while not self._stop.wait(self.interval):
                table = deltalake.DeltaTable(str(self.root))
                step = next(steps)
                if step == "append":
                    deltalake.write_deltalake(table, _rows(self._next_id, 3), mode="append")
                    self._next_id += 3
                elif step == "update":
                    table.update(
                        predicate=f"id % 5 = {self.commits % 5}",
                        updates={"amount": "amount + 1"},
                    )
                elif step == "delete":
                    table.delete(f"id = {self.commits % max(self._next_id, 1)}")
                else:
                    source = _rows(self._next_id - 2, 4)
                    self._next_id += 2
                    (
                        table.merge(
                            source, predicate="t.id = s.id", source_alias="s", target_alias="t"
                        )
                        .when_matched_update_all()
                        .when_not_matched_insert_all()
                        .execute()
                    )
                self.commits += 1
        except BaseException as e:  # reported by run_demo
            self.error = e


def _printer(out: TextIO) -> CallbackSink:
    def show(delivery: Delivery) -> None:
        try:
            for batch in delivery.batches:
                for row in batch.to_pylist():
                    kind = row.pop("_change_type")
                    version = row.pop("_commit_version")
                    row.pop("_commit_timestamp")
                    data = json.dumps({k: json_value(v) for k, v in row.items()})
                    out.write(f"v{version:<4} {kind:<17} {data}\n")
            out.flush()
        except BrokenPipeError:  # ``demo | head``: the stream ends instead of retrying
            raise OutputClosedError("demo:print", "standard output was closed") from None

    return CallbackSink(show, description="demo:print")


async def run_demo(
    path: Path,
    out: TextIO,
    *,
    duration: float | None = None,
    interval: float = 1.0,
    stop: anyio.Event | None = None,
    force: bool = False,
) -> Service:
    """Claim ``path`` (:func:`claim_demo_directory`; ``force`` as there), create the table,
    start the writer and tail the table until ``duration`` seconds have passed or ``stop``
    is set (the CLI sets it on Ctrl-C)."""
    directory = await anyio.to_thread.run_sync(lambda: claim_demo_directory(path, force=force))
    root = await anyio.to_thread.run_sync(create_demo_table, directory)
    state = directory / "state"
    out.write(f"deltastream demo: following {root} (a writer commits every {interval}s)\n")
    config = TailConfig(name="demo", uri=str(root), state=str(state), poll_interval=0.25)
    sink = _printer(out)
    service = Service(single_stream(config, sink.description), sinks={"demo": sink})
    writer = DemoWriter(root, interval)
    writer.start()
    try:
        async with anyio.create_task_group() as tg:

            async def stop_on_request() -> None:
                with anyio.move_on_after(duration):
                    await (stop or anyio.Event()).wait()
                service.stop()

            tg.start_soon(stop_on_request)
            await service.run()
            tg.cancel_scope.cancel()
    finally:
        await anyio.to_thread.run_sync(writer.stop)
    if writer.error is not None:
        raise InvalidArgumentError(f"the demo writer failed: {writer.error}") from writer.error
    m = service.metrics["demo"]
    out.write(
        f"deltastream demo: {writer.commits} commits written, {m.rows_delivered} change rows "
        f"delivered up to version {m.last_delivered_version}\n"
    )
    return service
