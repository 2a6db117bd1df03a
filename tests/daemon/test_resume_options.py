"""A stream resumed inside a version (a large version delivered in parts) goes on only under
the row options that produced its first rows (``where``, ``columns``, ``row_ids``,
``infer_without_cdf``, recorded in its state): its position counts the rows they gave. At a
version's start they may change."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from deltalake import write_deltalake
from tailing import Collector, batch, fast, run_until_delivered

from deltastream.daemon.delivery import Delivery, Position
from deltastream.daemon.sinks import CallbackSink
from deltastream.daemon.stream.state import POSITION_KEY
from deltastream.daemon.stream.tailer import Mode, StartFrom, TailConfig, Tailer
from deltastream.errors import InvalidArgumentError


def stream(tmp_path: Path, uri: str, where: str) -> TailConfig:
    """Version 0 on, 3 rows per delivery (so a version of three files comes in parts)."""
    config = TailConfig(
        name="s",
        uri=uri,
        state=str(tmp_path / "state"),
        mode=Mode.FOLLOW,
        start=StartFrom(version=0),
        notifications=False,
    )
    return fast(config, where=where, max_rows_per_delivery=3)


def recorded(tmp_path: Path) -> object:
    """The row options the stream's state records."""
    return json.loads((tmp_path / "state" / POSITION_KEY).read_text())["row_options"]


@pytest.mark.anyio
async def test_a_stream_stopped_inside_a_version_resumes_only_under_its_row_options(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "t")
    # Version 0: ids 0..9 in three files (one per part), read as three batches.
    write_deltalake(uri, batch(range(10)), partition_by=["part"])
    first: list[int] = []

    def fail_the_second(delivery: Delivery) -> None:
        if first:  # the process dies here: its first delivery committed, inside version 0
            raise RuntimeError("killed")
        first.extend(i for b in delivery.batches for i in b.column("id").to_pylist())

    tailer = Tailer(
        stream(tmp_path, uri, "id >= 2"),
        CallbackSink(fail_the_second, description="test:collector"),
    )
    with pytest.raises(Exception, match="killed"), anyio.fail_after(30):
        await tailer.run()
    assert first and tailer.position == Position(0, offset=len(first))
    assert recorded(tmp_path) == {"where": "id >= 2"}

    changed = Tailer(stream(tmp_path, uri, "id >= 4"), Collector().sink())
    with pytest.raises(InvalidArgumentError) as caught, anyio.fail_after(30):
        await changed.run()
    message = str(caught.value)
    assert message.startswith(
        f"stream 's': its last delivery ended inside version 0 (after {len(first)} of its "
        "rows), which it "
        "read with other options: where 'id >= 2', now 'id >= 4'; the position counts the "
        "rows those options gave, so under these it would fall elsewhere. Restart the stream "
        "with the options it ran with until it has delivered version 0, then change them; or "
        "to discard the stream's output and state and start over: deltastream reset"
    ), message

    # Under its options the stream delivers the rest of version 0, once.
    rest = Collector()
    await run_until_delivered(stream(tmp_path, uri, "id >= 2"), rest, 0)
    assert sorted(first + [r["id"] for r in rest.rows]) == list(range(2, 10))

    # At version 1's start, another filter goes (and is recorded).
    write_deltalake(uri, batch(range(10, 20)), mode="append", partition_by=["part"])
    later = Collector()
    await run_until_delivered(stream(tmp_path, uri, "id >= 15"), later, 1)
    assert sorted(r["id"] for r in later.rows) == list(range(15, 20))
    assert recorded(tmp_path) == {"where": "id >= 15"}
