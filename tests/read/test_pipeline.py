"""Reading many files at once (deltastream.read.pipeline): batches come out in the order of
the reads, each paired with its read, whether files are decoded alone or in groups of small
files; a missing or broken file in the middle of a group is reported (or skipped) at its
place; files of different schemas in one group are each read by their own schema; leaving
early stops the workers and closes the files."""

from __future__ import annotations

import gc
import json
import os
import threading
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipeline_reads import read_pairs

from deltastream.errors import DataFileError, DataFileNotFoundError
from deltastream.read.batch_stream import BatchStream, to_record_batch_reader
from deltastream.read.pipeline import read_file_batches
from deltastream.read.reader import FileRead, ReadSchema
from deltastream.schema.model import ColumnMappingMode, parse_schema
from deltastream.storage import open_store


def _schema(fields: list[tuple[str, str, dict[str, Any]]]) -> str:
    return json.dumps(
        {
            "type": "struct",
            "fields": [
                {"name": n, "type": t, "nullable": True, "metadata": m} for n, t, m in fields
            ],
        }
    )


ID_S = ReadSchema(
    table_schema=parse_schema(_schema([("id", "long", {}), ("s", "string", {})])),
    columns=("id", "s"),
)


def _write(root: Path, name: str, ids: range, **extra: Any) -> FileRead:
    table = pa.table({"id": pa.array(ids, pa.int64()), "s": [f"s{i}" for i in ids], **extra})
    pq.write_table(table, root / name)
    return FileRead(path=name, size=(root / name).stat().st_size)


def test_many_small_files_come_out_in_order_paired_with_their_reads(tmp_path: Path) -> None:
    """60 small files (groups of 1, 2, 4, 8, 16, 16, 13), a file of unknown size (read
    alone) in the middle: every batch in read order, and each paired with its own file."""
    reads = [
        (_write(tmp_path, f"f{i}.parquet", range(i * 10, i * 10 + 10)), ID_S) for i in range(60)
    ]
    unsized = FileRead(path=reads[30][0].path)  # no size: read alone, not grouped
    reads[30] = (unsized, ID_S)
    for concurrency in (1, 2, 4):
        got = read_pairs(tmp_path, reads, concurrency=concurrency)
        assert [path for path, _ in got] == [f"f{i}.parquet" for i in range(60)]
        for path, batch in got:
            i = int(path[1:].split(".")[0])
            assert batch["id"].to_pylist() == list(range(i * 10, i * 10 + 10))
            assert batch["s"].to_pylist() == [f"s{j}" for j in range(i * 10, i * 10 + 10)]


def test_a_missing_file_in_a_group_is_skipped_or_reported_at_its_place(tmp_path: Path) -> None:
    reads = [(_write(tmp_path, f"f{i}.parquet", range(i, i + 1)), ID_S) for i in range(12)]
    os.remove(tmp_path / "f5.parquet")  # in the third group (files 3..6)
    skipped: list[str] = []

    def skip(task: FileRead, error: DataFileNotFoundError) -> bool:
        assert str(tmp_path / task.path) in str(error)
        skipped.append(task.path)
        return True

    got = read_pairs(tmp_path, reads, on_missing=skip)
    assert skipped == ["f5.parquet"]
    assert [p for p, _ in got] == [f"f{i}.parquet" for i in range(12) if i != 5]

    seen: list[str] = []
    with pytest.raises(DataFileNotFoundError, match=r"f5\.parquet"):
        read_pairs(tmp_path, reads, seen=seen)
    assert seen == [f"f{i}.parquet" for i in range(5)]  # everything before it, nothing after


def test_a_broken_file_in_a_group_fails_naming_it_after_the_files_before_it(
    tmp_path: Path,
) -> None:
    reads = [(_write(tmp_path, f"f{i}.parquet", range(i, i + 1)), ID_S) for i in range(12)]
    data = (tmp_path / "f9.parquet").read_bytes()
    (tmp_path / "f9.parquet").write_bytes(data[: len(data) // 2])  # truncated, in a group
    reads[9] = (FileRead(path="f9.parquet", size=len(data) // 2, version=7), ID_S)
    seen: list[str] = []
    with pytest.raises(DataFileError, match=r"f9\.parquet") as caught:
        read_pairs(tmp_path, reads, seen=seen)
    assert caught.value.version == 7
    assert seen == [f"f{i}.parquet" for i in range(9)]


def test_files_of_different_schemas_in_one_group_are_each_read_by_their_own(
    tmp_path: Path,
) -> None:
    """One group: a file with both columns, one without ``s`` (added later: nulls), one
    whose column is spelled ``ID`` (matched case-insensitively), then both columns again."""
    a = _write(tmp_path, "a.parquet", range(0, 3))
    pq.write_table(pa.table({"id": pa.array([3, 4], pa.int64())}), tmp_path / "b.parquet")
    pq.write_table(pa.table({"ID": pa.array([5], pa.int64()), "s": ["x"]}), tmp_path / "c.parquet")
    d = _write(tmp_path, "d.parquet", range(6, 8))
    reads = [
        (a, ID_S),
        (a, ID_S),  # groups of 1 and 2 first: the next four files share one group
        (a, ID_S),
        (FileRead("b.parquet", size=(tmp_path / "b.parquet").stat().st_size), ID_S),
        (FileRead("c.parquet", size=(tmp_path / "c.parquet").stat().st_size), ID_S),
        (d, ID_S),
    ]
    got = read_pairs(tmp_path, reads)
    table = pa.Table.from_batches([b for _, b in got[3:]])
    assert table.to_pydict() == {"id": [3, 4, 5, 6, 7], "s": [None, None, "x", "s6", "s7"]}


def test_column_mapping_by_id_is_worked_out_per_file_schema(tmp_path: Path) -> None:
    """Two files whose columns have the same names but swapped parquet field ids: each is
    read by its own ids (a layout reused across files must tell them apart)."""
    schema = parse_schema(
        _schema(
            [
                (
                    "x",
                    "long",
                    {"delta.columnMapping.id": 1, "delta.columnMapping.physicalName": "p1"},
                ),
                (
                    "y",
                    "long",
                    {"delta.columnMapping.id": 2, "delta.columnMapping.physicalName": "p2"},
                ),
            ]
        )
    )
    read_schema = ReadSchema(table_schema=schema, columns=("x", "y"), mode=ColumnMappingMode.ID)

    def write(name: str, ids: tuple[int, int]) -> FileRead:
        fields = [
            pa.field("c1", pa.int64(), metadata={b"PARQUET:field_id": str(ids[0]).encode()}),
            pa.field("c2", pa.int64(), metadata={b"PARQUET:field_id": str(ids[1]).encode()}),
        ]
        table = pa.Table.from_arrays([pa.array([10]), pa.array([20])], schema=pa.schema(fields))
        pq.write_table(table, tmp_path / name)
        return FileRead(path=name, size=(tmp_path / name).stat().st_size)

    same, swapped = write("same.parquet", (1, 2)), write("swapped.parquet", (2, 1))
    reads = [(same, read_schema)] * 3 + [(same, read_schema), (swapped, read_schema)]
    got = [b.to_pydict() for _, b in read_pairs(tmp_path, reads)]
    assert got[3] == {"x": [10], "y": [20]}
    assert got[4] == {"x": [20], "y": [10]}


def _threads(prefix: str, already: Collection[threading.Thread] = ()) -> list[threading.Thread]:
    """The live threads named ``prefix...`` but those in ``already``: threads that were
    running before the test (an earlier test's, still winding down on a busy machine)."""
    return [t for t in threading.enumerate() if t.name.startswith(prefix) and t not in already]


def _open_files(root: Path) -> int:
    fds = Path("/proc/self/fd")
    count = 0
    for fd in fds.iterdir():
        try:
            count += os.readlink(fd).startswith(str(root))
        except OSError:
            continue
    return count


def test_leaving_early_stops_the_workers_and_closes_the_files(tmp_path: Path) -> None:
    before = set(_threads("deltastream-read"))
    reads = [(_write(tmp_path, f"f{i}.parquet", range(i, i + 1)), ID_S) for i in range(100)]

    async def first_only() -> str:
        async def tasks():  # type: ignore[no-untyped-def]
            for r in reads:
                yield r

        async with open_store(str(tmp_path)) as store:
            pairs = read_file_batches(store, tasks())
            task, _ = await anext(pairs)
            await pairs.aclose()
            return task.path

    assert anyio.run(first_only) == "f0.parquet"
    deadline = time.monotonic() + 10
    while (_threads("deltastream-read", before) or _open_files(tmp_path)) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert _threads("deltastream-read", before) == []
    assert _open_files(tmp_path) == 0


def test_sync_reader_hands_over_every_batch_and_stops_its_producer(tmp_path: Path) -> None:
    """The synchronous bridge: all batches in order and an error at its place; a reader
    dropped early, even before its first batch, ends its producer thread, which was waiting
    for room. (pyarrow's ``close()`` keeps the Python iterator alive, so dropping the reader
    is what ends it.)"""

    def reader(n: int, fail_at: int | None = None) -> pa.RecordBatchReader:
        async def batches():  # type: ignore[no-untyped-def]
            for i in range(n):
                if i == fail_at:
                    raise DataFileError("f.parquet", "broken")
                yield pa.record_batch({"i": [i]})

        async def open_stream() -> BatchStream:
            return BatchStream(pa.schema([("i", pa.int64())]), batches())

        return to_record_batch_reader(open_stream)

    before = set(_threads("deltastream-stream"))
    assert [b["i"][0].as_py() for b in reader(50)] == list(range(50))
    got: list[int] = []
    with pytest.raises(DataFileError, match="broken"):
        for b in reader(50, fail_at=20):
            got.append(b["i"][0].as_py())
    assert got == list(range(20))
    early = reader(1_000)
    assert early.read_next_batch()["i"][0].as_py() == 0
    untouched = reader(1_000)  # dropped before its first batch (a caller that failed)
    del early, untouched
    gc.collect()
    deadline = time.monotonic() + 10
    while _threads("deltastream-stream", before):
        assert time.monotonic() < deadline, "the producer thread did not stop"
        time.sleep(0.05)
