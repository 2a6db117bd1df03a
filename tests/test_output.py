"""JSON-lines output (``deltastream.output``, used by ``read``/``changes -o -`` and the
``jsonl`` and ``http`` sinks): variants come out as the JSON value they hold, at any depth;
a struct of the same shape that is not a variant stays two base64 strings."""

from __future__ import annotations

import io
import json
from typing import Any

import pyarrow as pa
import variant_tables as vt
from conftest import CORPORA

import deltastream as ds
from deltastream.cli import run
from deltastream.output import batch_to_json_lines
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
