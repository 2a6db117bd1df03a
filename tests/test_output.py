"""JSON-lines output (``deltastream.output``, used by ``read``/``changes -o -`` and the
``jsonl`` and ``http`` sinks): variants come out as the JSON value they hold, at any depth;
a struct of the same shape that is not a variant stays two base64 strings; decimals are
fixed-point strings at their column's scale. Parquet outputs get the permissions the umask
leaves, as any file opened for writing."""

from __future__ import annotations

import decimal
import io
import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import variant_tables as vt
from conftest import CORPORA
from deltalake import write_deltalake
from json_decimals import DECIMALS, decimal_table, expected_rows

import deltastream as ds
from deltastream.cli import run
from deltastream.output import batch_to_json_lines, create_temp_file, json_text_array, json_value
from deltastream.schema.model import VARIANT_ARROW_TYPE, is_variant_arrow

UNSHREDDED = CORPORA / "delta-kernel-rs/data/unshredded-variant"


def variants(*values: Any) -> pa.StructArray:
    names = ["a", "b"]
    meta = vt.metadata(*names)
    return pa.StructArray.from_arrays(
        [pa.array([meta] * len(values)), pa.array([vt.encode(v, names) for v in values])],
        fields=list(VARIANT_ARROW_TYPE),
    )


def test_variants_are_written_as_their_json_values_at_any_depth() -> None:
    v = variants({"a": 1, "b": [True, None, "x"]}, 2.5)
    nested = pa.StructArray.from_arrays([v], names=["inner"])
    listed = pa.ListArray.from_arrays(pa.array([0, 1, 2], pa.int32()), v)
    batch = pa.record_batch({"v": v, "s": nested, "l": listed})
    rows = [json.loads(line) for line in batch_to_json_lines(batch)]
    assert rows == [
        {"v": {"a": 1, "b": [True, None, "x"]}, "s": {"inner": {"a": 1, "b": [True, None, "x"]}},
         "l": [{"a": 1, "b": [True, None, "x"]}]},
        {"v": 2.5, "s": {"inner": 2.5}, "l": [2.5]},
    ]  # fmt: skip


def test_a_struct_shaped_like_a_variant_without_the_marker_stays_binary() -> None:
    plain = pa.struct(
        [pa.field("metadata", pa.binary(), False), pa.field("value", pa.binary(), False)]
    )
    assert plain == VARIANT_ARROW_TYPE and not is_variant_arrow(plain)
    arr = pa.StructArray.from_arrays([pa.array([b"\x01"]), pa.array([b"\x02"])], fields=list(plain))
    (line,) = batch_to_json_lines(pa.record_batch({"s": arr}))
    assert json.loads(line) == {"s": {"metadata": "AQ==", "value": "Ag=="}}


def test_a_null_variant_is_null_and_a_variant_null_is_null_too() -> None:
    v = variants(None)
    masked = pa.StructArray.from_arrays(
        [v.field("metadata"), v.field("value")],
        fields=list(VARIANT_ARROW_TYPE),
        mask=pa.array([True]),
    )
    for arr in (v, masked):
        (line,) = batch_to_json_lines(pa.record_batch({"v": arr}))
        assert json.loads(line) == {"v": None}


def test_decimals_are_fixed_point_strings_at_the_columns_scale() -> None:
    (batch,) = decimal_table().to_batches()
    assert [json.loads(line) for line in batch_to_json_lines(batch)] == expected_rows()
    # Nested (PostgreSQL's jsonb columns): the same texts.
    nested = batch.to_struct_array()
    assert [json.loads(t) for t in json_text_array(nested).to_pylist()] == expected_rows()
    listed = pa.ListArray.from_arrays(pa.array([0, 3], pa.int32()), batch.column("d20_10"))
    assert [json.loads(t) for t in json_text_array(listed).to_pylist()] == [DECIMALS["d20_10"][2]]
    # A Decimal in exponent notation, as Python may hold one: its own digits, no exponent.
    for value, text in (("1E+3", "1000"), ("-1.50E+2", "-150"), ("-2E-12", "-0.000000000002")):
        assert json_value(decimal.Decimal(value)) == text


def test_read_and_changes_write_decimals_as_fixed_point_strings(
    tmp_path: Path, capsys: Any
) -> None:
    uri = str(tmp_path / "t")
    write_deltalake(uri, decimal_table(), configuration={"delta.enableChangeDataFeed": "true"})
    assert run(["read", uri, "-o", "-"]) == 0
    lines = [json.loads(line) for line in io.StringIO(capsys.readouterr().out)]
    assert lines == expected_rows()
    assert run(["changes", uri, "--from", "0", "-o", "-"]) == 0
    lines = [json.loads(line) for line in io.StringIO(capsys.readouterr().out)]
    assert [{c: r[c] for c in DECIMALS} for r in lines] == expected_rows()


def test_the_read_command_writes_a_corpus_tables_variants_as_json(
    capsys: Any,
) -> None:
    assert run(["read", str(UNSHREDDED), "-o", "-"]) == 0
    lines = [json.loads(line) for line in io.StringIO(capsys.readouterr().out)]
    table = ds.read_rows(str(UNSHREDDED)).read_all()
    expected = vt.json_rows(table)
    assert len(lines) == len(expected) > 0
    variant_columns = [f.name for f in table.schema if is_variant_arrow(f.type)]
    assert variant_columns
    decoded = sorted(json.dumps({c: r[c] for c in variant_columns}, sort_keys=True) for r in lines)
    assert decoded == sorted(
        json.dumps(
            {c: None if r[c] is None else json.loads(r[c]) for c in variant_columns},
            sort_keys=True,
        )
        for r in expected
    )


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_read_and_changes_write_parquet_files_as_the_umask_allows(
    tmp_path: Path, umask: int, mode: int
) -> None:
    table = str(tmp_path / "t")
    write_deltalake(
        table,
        pa.table({"id": pa.array([1, 2], pa.int64())}),
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    for command in ("read", "changes"):
        out = tmp_path / f"{command}-{umask:03o}.parquet"
        script = f"umask {umask:03o} && exec {shlex.quote(sys.executable)} -m deltastream "
        script += shlex.join([command, table, "-o", str(out)])
        done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        assert stat.S_IMODE(out.stat().st_mode) == mode, command
        assert pq.read_table(out).num_rows == 2
        # No temporary file left beside it.
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_temporary_files_are_created_new_with_the_umask_applied(tmp_path: Path) -> None:
    previous = os.umask(0o027)
    try:
        made = [create_temp_file(tmp_path, ".x-", ".tmp") for _ in range(20)]
    finally:
        os.umask(previous)
    assert len(set(made)) == 20
    for path in made:
        name = Path(path).name
        assert re.fullmatch(r"\.x-[0-9a-f]{8}\.tmp", name), name
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
        assert os.path.getsize(path) == 0
