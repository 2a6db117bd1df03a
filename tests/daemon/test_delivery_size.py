"""How many rows a delivery holds: at most ``max_bytes_per_delivery`` bytes of Arrow data and
``max_rows_per_delivery`` rows (whole batches: a delivery closes before the batch that would
follow either bound, and one batch always fits), the rows by default the sink's own (a
million for the sinks whose every delivery is a commit, 100,000 for the others)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from tailing import CDF, SMALL_GROUPS, Collector, batch, create_table, fast, run_tailer_until

from deltastream.cli import run
from deltastream.daemon.delivery import Delivery, Position
from deltastream.daemon.sinks import parse_sink
from deltastream.daemon.sinks.parquet import parse_parquet_file_name
from deltastream.daemon.stream.tailer import Mode, StartFrom, TailConfig

#: The one version of :func:`grouped`: 40 rows in 10 row groups, so 10 batches of 4 rows.
ROWS = 40


@pytest.fixture(scope="module")
def grouped(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A table whose version 0 is 40 rows in 4-row row groups (the reader's batches)."""
    uri = str(tmp_path_factory.mktemp("grouped") / "table")
    ids = range(100, 100 + ROWS)  # names of one length: batches of one size
    write_deltalake(uri, batch(ids), configuration=CDF, writer_properties=SMALL_GROUPS)
    return uri


def delivered(version: int) -> Any:
    return lambda t: t.position is not None and t.position >= Position(version + 1)


def nbytes(delivery: Delivery) -> int:
    return sum(b.nbytes for b in delivery.batches)


def test_a_delivery_closes_at_the_byte_bound(grouped: str, tmp_path: Path) -> None:
    """``--max-bytes-per-delivery 1``: every batch is a delivery of its own (one batch always
    fits), each its own parquet file, starting 4 rows after the one before; by default the
    whole snapshot is one delivery."""

    def snapshot(out: Path, *options: str) -> list[tuple[Position, int]]:
        args = ["tail", grouped, "--mode", "snapshot", "--sink", f"parquet:{out}"]
        assert run([*args, "--state", str(out) + "-state", "--progress", "never", *options]) == 0
        found = []
        for file in sorted(out.glob("*.parquet")):
            name = parse_parquet_file_name(file.name)
            assert name is not None, file
            found.append((name.start, pq.read_metadata(file).num_rows))
        return found

    by_batch = snapshot(tmp_path / "by-batch", "--max-bytes-per-delivery", "1")
    assert by_batch == [(Position(0, True, offset), 4) for offset in range(0, ROWS, 4)]
    assert snapshot(tmp_path / "default") == [(Position(0, True, 0), ROWS)]


@pytest.mark.anyio
async def test_a_delivery_ends_with_the_batch_that_reaches_the_byte_bound(
    grouped: str, tmp_path: Path
) -> None:
    """With a bound of two and a half batches, each delivery but a round's last holds the
    batches up to the first that reaches the bound: three of them here."""

    def config(state: str, max_bytes: int) -> TailConfig:
        return fast(
            TailConfig(
                name="t",
                uri=grouped,
                state=str(tmp_path / state),
                mode=Mode.FOLLOW,
                start=StartFrom(version=0),
                max_bytes_per_delivery=max_bytes,
            )
        )

    one_each = Collector()
    await run_tailer_until(config("one", 1), one_each.sink(), delivered(0))
    sizes = {nbytes(d) for d in one_each.deliveries}
    assert len(one_each.deliveries) == ROWS // 4 and len(sizes) == 1  # alike batches
    bound = int(sizes.pop() * 2.5)
    collector = Collector()
    await run_tailer_until(config("bound", bound), collector.sink(), delivered(0))
    deliveries = collector.deliveries
    assert [d.num_rows for d in deliveries] == [12, 12, 12, 4]
    for d in deliveries[:-1]:
        assert sum(b.nbytes for b in d.batches[:-1]) < bound <= nbytes(d)
    assert nbytes(deliveries[-1]) < bound
    assert [r["id"] for r in collector.rows] == list(range(100, 100 + ROWS))
    assert [d.end for d in deliveries] == [
        Position(0, False, 12),
        Position(0, False, 24),
        Position(0, False, 36),
        Position(1),
    ]


# ------------------------------------------------------------ the sink's rows per delivery

#: Version 1 of :func:`large_version`: more rows than 100,000, fewer than a million.
LARGE = 150_000


@pytest.fixture(scope="module")
def large_version(tmp_path_factory: pytest.TempPathFactory) -> str:
    uri = str(tmp_path_factory.mktemp("large") / "table")
    create_table(uri)
    ids = pa.array(range(1000, 1000 + LARGE), pa.int64())
    rows = pa.table({"id": ids, "name": pa.array(["n"] * LARGE), "part": pa.array(["p0"] * LARGE)})
    write_deltalake(uri, rows, mode="append")
    return uri


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("sink", "given", "deliveries"),
    [
        ("callback", None, 2),  # the sink's own: 100,000 rows
        ("callback", 1_000_000, 1),  # the setting wins
        ("delta", None, 1),  # the sink's own: 1,000,000 rows, one commit
        ("delta", 100_000, 2),  # the setting wins
    ],
)
async def test_the_sinks_rows_per_delivery_apply_unless_the_stream_sets_them(
    large_version: str, tmp_path: Path, sink: str, given: int | None, deliveries: int
) -> None:
    config = fast(
        TailConfig(
            name="t",
            uri=large_version,
            state=str(tmp_path / "state"),
            mode=Mode.FOLLOW,
            start=StartFrom(version=1),
            max_rows_per_delivery=given,
        )
    )
    collector = Collector()
    target = tmp_path / "target"
    chosen = collector.sink() if sink == "callback" else parse_sink(f"delta:{target}")
    tailer = await run_tailer_until(config, chosen, delivered(1))
    assert tailer.metrics.rows_delivered == LARGE
    assert tailer.metrics.deliveries == deliveries
    if sink == "callback":
        assert len(collector.deliveries) == deliveries
    else:
        table = DeltaTable(str(target))
        assert table.version() + 1 == deliveries  # one commit per delivery
        assert table.to_pyarrow_table().num_rows == LARGE
