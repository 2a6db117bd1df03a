"""``where`` on the change feed: over the randomized histories of test_cdf_randomized.py
(plain, escaped partition values, column mapping), ``read_changes(where=P)`` gives exactly
the rows of the unfiltered change feed filtered by ``P`` afterwards, for predicates on data
columns, the partition column and the change columns (``_change_type``,
``_commit_version``, ``_commit_timestamp``); files that cannot match are not opened; bad
predicates are clear errors; ``changes --where`` and the tailer's ``where`` do the same."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest
from test_cdf_randomized import COLUMN_MAPPED, ESCAPED, FEW_SEEDS, PLAIN, SEEDS, build

import deltastream as ds
from deltastream.changes.cdf import plan_changes
from deltastream.cli import run
from deltastream.read.predicates import parse_predicate, to_arrow_expression
from deltastream.schema.model import PrimitiveType, StructField, StructType, table_schema

#: Predicates over the randomized tables' columns (id, cat, bucket, x, s, d, ts, flag, amt;
#: ``cat`` is the partition column when the table is partitioned).
PREDICATES = [
    "id < 20",
    "id >= 40 AND flag = TRUE",
    "cat = 'north'",
    "cat IS NULL OR bucket IN (1, 2)",
    "NOT (cat = 'south')",
    "_change_type <> 'update_preimage'",
    "_change_type IN ('delete', 'update_postimage') AND x > 0",
    "_commit_version >= 3 AND _commit_version <= 7",
    "_commit_version = 2 OR id % 1 IS NULL",
    "_commit_timestamp > '2000-01-01T00:00:00Z' AND amt < 50",
    "d < '2000-01-01' OR s = 'plain'",
    "NOT (_change_type = 'insert' AND bucket = 3)",
]


def rows(table: pa.Table) -> Counter[str]:
    return Counter(json.dumps(r, sort_keys=True, default=str) for r in table.to_pylist())


def filtered(path: str, table: pa.Table, where: str) -> pa.Table:
    """The oracle: the full change feed filtered afterwards, by Arrow."""
    schema = table_schema(ds.read_snapshot(path).metadata)
    change_columns = (
        StructField("_change_type", PrimitiveType("string")),
        StructField("_commit_version", PrimitiveType("long")),
        StructField("_commit_timestamp", PrimitiveType("timestamp")),
    )
    predicate = parse_predicate(where, StructType((*schema.fields, *change_columns)))
    return table.filter(to_arrow_expression(predicate))


def check(path: str) -> None:
    full = ds.read_changes(path).read_all()
    assert full.num_rows > 0
    for where in PREDICATES:
        if "id % 1" in where:  # not in the language: the parser says so
            with pytest.raises(ds.InvalidArgumentError, match="invalid predicate"):
                ds.read_changes(path, where=where)
            continue
        got = ds.read_changes(path, where=where).read_all()
        assert got.schema == full.schema, where
        assert rows(got) == rows(filtered(path, full, where)), where


@pytest.mark.parametrize("seed", SEEDS)
def test_filtered_changes_equal_the_filtered_change_feed(tmp_path: Path, seed: int) -> None:
    check(build(tmp_path, seed, PLAIN).path)


@pytest.mark.parametrize("seed", FEW_SEEDS)
def test_filters_with_escaped_partition_values_and_column_mapping(
    tmp_path: Path, seed: int
) -> None:
    check(build(tmp_path / "escaped", seed, ESCAPED).path)
    check(build(tmp_path / "mapped", seed, COLUMN_MAPPED).path)


def test_files_that_cannot_match_are_not_opened(tmp_path: Path) -> None:
    history = build(tmp_path, SEEDS[0], PLAIN)

    async def planned(where: str | None) -> list[Any]:
        async with ds.open_table(history.path) as table:
            plan = await plan_changes(table.store, where=where)
            return [read async for read, _ in plan.tasks]

    every = anyio.run(planned, None)
    one_version = anyio.run(planned, "_commit_version = 2")
    assert one_version and {r.version for r in one_version} == {2}
    assert len(one_version) == sum(1 for r in every if r.version == 2) < len(every)
    assert anyio.run(planned, "_commit_version > 1000") == []
    column = history.partition_by
    assert column is not None  # the first seed's table is partitioned
    value = next(r.partition_values[column] for r in every if r.partition_values.get(column))
    literal = value if column == "bucket" else f"'{value}'"
    one_partition = anyio.run(planned, f"{column} = {literal}")
    assert one_partition and len(one_partition) < len(every)
    assert all(r.partition_values.get(column) == value for r in one_partition)


def test_reads_decided_by_file_skipping_need_no_row_filter(tmp_path: Path) -> None:
    """Files kept by a predicate on the partition column, ``_commit_version`` or (files read
    from add/remove actions) ``_change_type`` match in every row: they are read without the
    row filter (``all_match``); any other predicate keeps the filter. The rows are checked
    against filtering afterwards by test_filtered_changes_equal_the_filtered_change_feed."""
    history = build(tmp_path, SEEDS[0], PLAIN)
    column = history.partition_by
    assert column is not None

    async def planned(where: str) -> list[tuple[Any, Any]]:
        async with ds.open_table(history.path) as table:
            plan = await plan_changes(table.store, where=where)
            return [(read, schema) async for read, schema in plan.tasks]

    def marked(where: str) -> set[bool]:
        return {read.all_match for read, _ in anyio.run(planned, where)}

    literal = "1" if column == "bucket" else "'north'"
    assert marked(f"{column} = {literal} OR _commit_version < 3") == {True}
    assert marked(f"{column} = {literal} AND id < 20") == {False}
    assert marked("_commit_timestamp > '2000-01-01T00:00:00Z'") == {False}
    by_kind = {
        schema.file_columns != (): read.all_match
        for read, schema in anyio.run(planned, "_change_type <> 'update_preimage'")
    }
    assert by_kind == {True: False, False: True}  # cdc files carry _change_type per row


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("nope = 1", "unknown column nope; the table has id, .*, _commit_timestamp"),
        ("id = 'x'", "id"),
        ("_change_type = ", "invalid predicate"),
    ],
)
def test_bad_predicates_are_clear_errors(tmp_path: Path, where: str, message: str) -> None:
    history = build(tmp_path, SEEDS[0], PLAIN)
    with pytest.raises(ds.InvalidArgumentError, match=message):
        ds.read_changes(history.path, where=where)


def test_cli_changes_where(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    history = build(tmp_path, SEEDS[0], PLAIN)
    where = "_change_type <> 'update_preimage' AND id < 30"
    assert run(["changes", history.path, "--where", where, "-o", "-"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = ds.read_changes(history.path, where=where).read_all().to_pylist()
    assert len(printed) == len(expected) > 0
    assert {r["_change_type"] for r in printed} <= {"insert", "delete", "update_postimage"}
    assert all(r["id"] < 30 for r in printed)
    assert run(["changes", history.path, "--where", "bogus >", "-o", "-"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("deltastream: error: invalid predicate") and "\n" not in err
