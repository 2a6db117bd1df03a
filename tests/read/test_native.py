"""Runs of files scanned natively (deltastream.read.native) give exactly what the per-file
reader gives: the same batches' rows, in the same order, of the same types, with partition
values and constants filled in; files that do not fit a scan (a column found only by its
case, a partition column stored in the file, a value that does not cast) are read by the
reader, with its errors."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipeline_reads import read_pairs

from deltastream.errors import DataFileError
from deltastream.read import native, pipeline
from deltastream.read.reader import FileRead, FileReader, ReadSchema
from deltastream.schema.model import ColumnMappingMode, parse_schema

CONSTANTS = (
    pa.field("_change_type", pa.string()),
    pa.field("_commit_version", pa.int64()),
    pa.field("_commit_timestamp", pa.timestamp("us", tz="UTC")),
)


def _schema(fields: list[tuple[str, str, dict[str, Any]]]) -> Any:
    return parse_schema(
        json.dumps(
            {
                "type": "struct",
                "fields": [
                    {"name": n, "type": t, "nullable": True, "metadata": m} for n, t, m in fields
                ],
            }
        )
    )


TABLE = _schema(
    [
        ("id", "long", {}),
        ("s", "string", {}),
        ("ts", "timestamp", {}),
        ("day", "date", {}),
        ("part", "string", {}),
    ]
)
PARTITIONED = ReadSchema(
    table_schema=TABLE,
    columns=("id", "s", "ts", "day", "part"),
    partition_columns=("day", "part"),
    constant_fields=CONSTANTS,
)
CDC = ReadSchema(
    table_schema=TABLE,
    columns=("id", "s", "ts", "day", "part"),
    partition_columns=("day", "part"),
    file_columns=(("_change_type", pa.string()),),
    constant_fields=CONSTANTS[1:],
)


def _write(root: Path, name: str, table: pa.Table, **task: Any) -> FileRead:
    pq.write_table(table, root / name)
    return FileRead(path=name, size=(root / name).stat().st_size, **task)


def _rows(n: int, first: int = 0, **columns: Any) -> pa.Table:
    data: dict[str, Any] = {
        "id": pa.array(range(first, first + n), pa.int64()),
        "s": [f"s{i}" for i in range(first, first + n)],
        "ts": pa.array(range(n), pa.timestamp("us", tz="UTC")),
    }
    data.update(columns)
    return pa.table(data)


def _both(
    root: Path, reads: list[tuple[FileRead, ReadSchema]], monkeypatch: pytest.MonkeyPatch
) -> tuple[list[tuple[str, pa.Table]], int]:
    """The (path, rows) of ``reads`` through the pipeline, asserted equal (rows, order,
    types) to the reader's alone; and how many files the reader read."""
    opened = 0
    original = FileReader.__init__

    def counting(self: FileReader, *a: Any, **k: Any) -> None:
        nonlocal opened
        opened += 1
        original(self, *a, **k)

    monkeypatch.setattr(FileReader, "__init__", counting)
    scanned = read_pairs(root, reads)
    reader_files = opened
    with monkeypatch.context() as m:
        m.setattr(pipeline.ScanPlan, "of", classmethod(lambda cls, schema: None))
        alone = read_pairs(root, reads)
    assert [p for p, _ in scanned] == [p for p, _ in alone]
    for (_, a), (_, b) in zip(scanned, alone, strict=True):
        assert a.schema.equals(b.schema, check_metadata=True)
    merged_a = pa.Table.from_batches([b for _, b in scanned], schema=alone[0][1].schema)
    merged_b = pa.Table.from_batches([b for _, b in alone], schema=alone[0][1].schema)
    assert merged_a.equals(merged_b)
    return [(p, pa.Table.from_batches([b])) for p, b in scanned], reader_files


def test_partition_values_and_constants_come_from_the_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ts = 1_700_000_000_000_000
    reads = []
    for i in range(40):
        part = [None, "", "a", "b"][i % 4]
        task = _write(
            tmp_path,
            f"f{i}.parquet",
            _rows(3 + i % 5, first=100 * i),
            partition_values={"day": f"2024-01-{1 + i % 3:02d}", "part": part},
            version=i // 4,
            constants=("insert" if i % 2 else "delete", i // 4, ts + i),
        )
        reads.append((task, PARTITIONED))
    got, reader_files = _both(tmp_path, reads, monkeypatch)
    assert reader_files == 0  # every file scanned
    first = got[2][1].to_pylist()[0]
    assert first["part"] == "a" and first["day"] == dt.date(2024, 1, 3)
    assert first["_change_type"] == "delete" and first["_commit_version"] == 0
    assert got[0][1].column("part").null_count == 3  # null and "" are both null
    assert got[1][1].column("part").null_count == 4


def test_files_over_the_scan_size_are_read_by_the_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only small files are scanned (FileReader costs less CPU on larger ones): a file of
    more bytes than ``_SCAN_FILE`` is read by the reader, the smaller ones around it
    scanned, with the same rows."""
    reads = []
    for i in range(6):
        rows = _rows(2_000 if i == 3 else 5, first=10_000 * i)
        task = _write(tmp_path, f"f{i}.parquet", rows, partition_values={"day": "2024-01-01"})
        reads.append((replace(task, constants=("insert", 7, 0)), PARTITIONED))
    big = reads[3][0].size
    assert big is not None and all(r.size < big for r, _ in reads if r is not reads[3][0])
    monkeypatch.setattr(pipeline, "_SCAN_FILE", big - 1)
    got, reader_files = _both(tmp_path, reads, monkeypatch)
    assert reader_files == 1
    assert [len(t) for _, t in got] == [5, 5, 5, 2_000, 5, 5]


def test_change_data_files_carry_their_change_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kinds = pa.array(["update_preimage", "update_postimage"] * 2)
    reads = [
        (
            _write(
                tmp_path,
                f"c{i}.parquet",
                _rows(4, _change_type=kinds),
                partition_values={"day": "2024-02-02", "part": "x"},
                constants=(i, 1000 * i),
            ),
            CDC,
        )
        for i in range(6)
    ]
    got, reader_files = _both(tmp_path, reads, monkeypatch)
    assert reader_files == 0
    assert got[5][1].column("_change_type").to_pylist() == kinds.to_pylist()


def test_files_that_do_not_fit_a_scan_are_read_by_the_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Among scanned files: narrower and view types (cast by the scan), a missing column
    (nulls), a column spelled ``ID`` and a stored partition column (the reader's)."""
    values = {"day": "2024-01-01", "part": "p"}
    constants = ("insert", 1, 2)
    tables = [
        _rows(3),
        _rows(2, id=pa.array([7, 8], pa.int32()), s=pa.array(["x", "y"], pa.string_view())),
        pa.table({"id": pa.array([1, 2], pa.int64())}),
        pa.table({"ID": pa.array([5], pa.int64()), "s": ["x"]}),
        _rows(2, part=["stored", "stored"]),
        _rows(4, first=50),
    ]
    reads = [
        (
            _write(tmp_path, f"m{i}.parquet", t, partition_values=values, constants=constants),
            PARTITIONED,
        )
        for i, t in enumerate(tables)
    ]
    got, reader_files = _both(tmp_path, reads, monkeypatch)
    assert reader_files == 2
    assert got[3][1].column("id").to_pylist() == [5]
    assert got[4][1].column("part").to_pylist() == ["p", "p"]  # the log's value
    assert got[2][1].column("s").null_count == 2


def test_column_mapping_by_name_reads_physical_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = _schema(
        [
            ("x", "long", {"delta.columnMapping.physicalName": "col-1"}),
            ("y", "string", {"delta.columnMapping.physicalName": "col-2"}),
            ("p", "integer", {"delta.columnMapping.physicalName": "col-3"}),
        ]
    )
    schema = ReadSchema(
        table_schema=table,
        columns=("x", "y", "p"),
        partition_columns=("p",),
        mode=ColumnMappingMode.NAME,
        constant_fields=CONSTANTS,
    )
    reads = [
        (
            _write(
                tmp_path,
                f"n{i}.parquet",
                pa.table({"col-1": pa.array([i, i + 1], pa.int64()), "col-2": ["a", "b"]}),
                partition_values={"col-3": str(i)},
                constants=("insert", i, 5),
            ),
            schema,
        )
        for i in range(5)
    ]
    got, reader_files = _both(tmp_path, reads, monkeypatch)
    assert reader_files == 0
    assert got[4][1].to_pylist()[1] == {
        "x": 5,
        "y": "b",
        "p": 4,
        "_change_type": "insert",
        "_commit_version": 4,
        "_commit_timestamp": dt.datetime(1970, 1, 1, 0, 0, 0, 5, tzinfo=dt.UTC),
    }


def test_a_scan_that_fails_leaves_the_file_to_the_reader_and_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A string column of a long: the scan's cast fails, the reader names the file."""
    values = {"day": "2024-01-01", "part": "p"}
    reads = [
        (
            _write(
                tmp_path,
                f"e{i}.parquet",
                _rows(2, id=["1", "x"]) if i == 5 else _rows(2),
                partition_values=values,
                constants=("insert", 1, 2),
                version=3,
            ),
            PARTITIONED,
        )
        for i in range(8)
    ]
    with pytest.raises(DataFileError, match=r"e5\.parquet"):
        read_pairs(tmp_path, reads)


def test_a_plan_is_refused_where_the_reader_must_do_the_work() -> None:
    assert native.ScanPlan.of(PARTITIONED) is not None
    by_id = ReadSchema(table_schema=TABLE, columns=("id",), mode=ColumnMappingMode.ID)
    assert native.ScanPlan.of(by_id) is None
    plan = native.ScanPlan.of(PARTITIONED)
    assert plan is not None
    from pyroaring import BitMap64

    assert not plan.takes(FileRead("f", exclude=BitMap64([1]), constants=("insert", 1, 2)))
    assert not plan.takes(FileRead("f", split=(0, 10), constants=("insert", 1, 2)))
    assert plan.takes(FileRead("f", constants=("insert", 1, 2)))
