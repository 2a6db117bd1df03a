"""Variant test data written by hand: a small Variant encoder independent of deltastream's,
the Arrow types of shredded Parquet groups, and Delta tables around such files.

The encoder below is deliberately not minimal (4-byte dictionary offsets, 4-byte field ids
and offsets, ``is_large`` set, long strings): a reader must accept any valid sizes, and a
value reassembled by deltastream is then never byte-equal to its input by accident. Values
are compared through pyspark's independent decoder (``VariantVal.toJson``) instead.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import struct
import uuid
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import logbuilder as lb
import pyarrow as pa
import pyarrow.parquet as pq
from pyroaring import BitMap64
from pyspark.sql.types import VariantVal

from deltastream.read.deletion_vectors import MAGIC_PORTABLE, encode_z85
from deltastream.schema.model import VARIANT_ARROW_TYPE

# --- encoding ----------------------------------------------------------------------------


def metadata(*names: str) -> bytes:
    """A metadata blob listing ``names`` (in this order; 4-byte offsets, not sorted)."""
    encoded = [n.encode() for n in names]
    out = bytearray([0x01 | (3 << 6)])
    out += struct.pack("<I", len(encoded))
    position = 0
    out += struct.pack("<I", 0)
    for e in encoded:
        position += len(e)
        out += struct.pack("<I", position)
    for e in encoded:
        out += e
    return bytes(out)


def encode(value: Any, names: Sequence[str]) -> bytes:
    """The encoding of a Python value (dict keys must be in ``names``)."""
    if value is None:
        return b"\x00"
    if value is True:
        return b"\x04"
    if value is False:
        return b"\x08"
    if isinstance(value, int):
        return bytes([6 << 2]) + struct.pack("<q", value)
    if isinstance(value, float):
        return bytes([7 << 2]) + struct.pack("<d", value)
    if isinstance(value, decimal.Decimal):
        sign, digits, exponent = value.as_tuple()
        assert isinstance(exponent, int)
        unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
        return bytes([10 << 2, -exponent]) + unscaled.to_bytes(16, "little", signed=True)
    if isinstance(value, str):
        raw = value.encode()
        return bytes([16 << 2]) + struct.pack("<I", len(raw)) + raw
    if isinstance(value, bytes):
        return bytes([15 << 2]) + struct.pack("<I", len(value)) + value
    if isinstance(value, dt.datetime):
        micros = (value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
        return bytes([12 << 2]) + struct.pack("<q", micros)
    if isinstance(value, dt.date):
        return bytes([11 << 2]) + struct.pack("<i", (value - dt.date(1970, 1, 1)).days)
    if isinstance(value, list):
        return array([encode(v, names) for v in value])
    if isinstance(value, dict):
        return obj({k: encode(v, names) for k, v in value.items()}, names)
    raise TypeError(value)


def array(elements: Sequence[bytes]) -> bytes:
    out = bytearray([3 | (((1 << 2) | 3) << 2)])  # array, is_large, 4-byte offsets
    out += struct.pack("<I", len(elements))
    position = 0
    for e in elements:
        out += struct.pack("<I", position)
        position += len(e)
    out += struct.pack("<I", position)
    for e in elements:
        out += e
    return bytes(out)


def obj(fields: dict[str, bytes], names: Sequence[str]) -> bytes:
    """An object of already encoded fields; values are stored in reverse key order (the
    spec lets values be in any order, only ids and offsets follow the keys)."""
    keys = sorted(fields, key=lambda k: k.encode())
    out = bytearray([2 | (((1 << 4) | (3 << 2) | 3) << 2)])  # object, is_large, 4-byte ids/offsets
    out += struct.pack("<I", len(keys))
    for k in keys:
        out += struct.pack("<I", list(names).index(k))
    sizes = {k: len(fields[k]) for k in keys}
    starts: dict[str, int] = {}
    position = 0
    for k in reversed(keys):
        starts[k] = position
        position += sizes[k]
    for k in keys:
        out += struct.pack("<I", starts[k])
    out += struct.pack("<I", position)
    for k in reversed(keys):
        out += fields[k]
    return bytes(out)


def to_json(variant: dict[str, bytes] | None) -> str | None:
    """pyspark's JSON of a variant ``{"metadata": ..., "value": ...}`` (None: SQL NULL)."""
    if variant is None:
        return None
    return str(VariantVal(variant["value"], variant["metadata"]).toJson())


def json_rows(table: pa.Table, *, sort_maps: bool = False) -> list[dict[str, Any]]:
    """Rows with every variant (found by the Arrow type, at any depth) decoded to JSON by
    pyspark's decoder; maps as lists of pairs (sorted with ``sort_maps``)."""

    def convert(value: Any, t: pa.DataType) -> Any:
        if value is None:
            return None
        if t == VARIANT_ARROW_TYPE:
            return to_json(value)
        if pa.types.is_struct(t):
            return {f.name: convert(value[f.name], f.type) for f in t}
        if pa.types.is_list(t):
            return [convert(v, t.value_type) for v in value]
        if pa.types.is_map(t):
            pairs = [(k, convert(v, t.item_type)) for k, v in value]
            return sorted(pairs) if sort_maps else pairs
        return value

    return [{f.name: convert(r[f.name], f.type) for f in table.schema} for r in table.to_pylist()]


def expected_json(value: Any) -> str:
    """The JSON pyspark's decoder writes for a value built of JSON types."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# --- shredded Parquet groups ---------------------------------------------------------------


def group_type(typed: pa.DataType | None, value: bool = True) -> pa.StructType:
    """A shredded ``value``/``typed_value`` group (an object field or array element)."""
    fields = []
    if value:
        fields.append(pa.field("value", pa.binary()))
    if typed is not None:
        fields.append(pa.field("typed_value", typed))
    return pa.struct(fields)


def object_type(**fields: pa.DataType) -> pa.StructType:
    """``typed_value`` of a shredded object: one required group per field."""
    return pa.struct([pa.field(k, group_type(t), nullable=False) for k, t in fields.items()])


def list_type(element: pa.DataType) -> pa.ListType:
    """``typed_value`` of a shredded array: a list of required element groups."""
    return pa.list_(pa.field("element", group_type(element), nullable=False))


def variant_type(typed: pa.DataType | None) -> pa.StructType:
    """A variant column's group: ``metadata``, ``value`` and (shredded) ``typed_value``."""
    fields = [pa.field("metadata", pa.binary(), nullable=False), pa.field("value", pa.binary())]
    if typed is not None:
        fields.append(pa.field("typed_value", typed))
    return pa.struct(fields)


# --- Delta tables --------------------------------------------------------------------------

VARIANT_PROTOCOL = lb.protocol(
    3,
    7,
    ["deletionVectors", "variantType", "variantShredding"],
    ["deletionVectors", "variantType", "variantShredding", "changeDataFeed"],
)


def schema_string(fields: Sequence[tuple[str, Any]], **metadata: dict[str, Any]) -> str:
    return json.dumps(
        {
            "type": "struct",
            "fields": [
                {"name": n, "type": t, "nullable": True, "metadata": metadata.get(n, {})}
                for n, t in fields
            ],
        }
    )


def metadata_action(
    schema: str,
    partition_columns: Sequence[str] = (),
    configuration: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "metaData": {
            "id": "00000000-0000-0000-0000-00000000000a",
            "format": {"provider": "parquet", "options": {}},
            "schemaString": schema,
            "partitionColumns": list(partition_columns),
            "configuration": configuration or {"delta.enableChangeDataFeed": "true"},
            "createdTime": 1700000000000,
        }
    }


def add_action(
    root: Path,
    name: str,
    partition_values: dict[str, str | None] | None = None,
    dv: dict[str, Any] | None = None,
    stats: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "path": name,
        "partitionValues": partition_values or {},
        "size": (root / name).stat().st_size,
        "modificationTime": 1700000000000,
        "dataChange": True,
    }
    if dv is not None:
        body["deletionVector"] = dv
    if stats is not None:
        body["stats"] = stats
    return {"add": body}


def write_file(root: Path, name: str, table: pa.Table) -> None:
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, root / name)


def single_file_table(root: Path, table: pa.Table, fields: Sequence[tuple[str, Any]]) -> Path:
    """A one-commit Delta table (variant features on) holding ``table`` as one data file."""
    write_file(root, "part-0.parquet", table)
    lb.LogWriter(root).commit(
        0,
        lb.commit_info(),
        VARIANT_PROTOCOL,
        metadata_action(schema_string(fields)),
        add_action(root, "part-0.parquet"),
    )
    return root


# --- a shredded object column, deletion vectors and the change data feed --------------------

NAMES = ("event_type", "event_ts", "email", "error_msg", "click", "tags", "location", "lat")
EVENT = object_type(event_type=pa.string(), event_ts=pa.int64())


def shredded_event(value: dict[str, Any] | Any, names: tuple[str, ...] = NAMES) -> dict[str, Any]:
    """One row of ``EVENT``, shredded as a writer would: fields of the shredded type go to
    ``typed_value``, others to the residual ``value``; a non-object goes to ``value``."""
    m = metadata(*names)
    if not isinstance(value, dict):
        return {"metadata": m, "value": encode(value, names), "typed_value": None}
    typed: dict[str, Any] = {}
    residual: dict[str, Any] = {}
    for key, v in value.items():
        shreddable = (key == "event_type" and isinstance(v, str)) or (
            key == "event_ts" and isinstance(v, int) and not isinstance(v, bool)
        )
        if shreddable:
            typed[key] = {"value": None, "typed_value": v}
        elif key in ("event_type", "event_ts"):
            typed[key] = {"value": encode(v, names), "typed_value": None}
        else:
            residual[key] = v
    for key in ("event_type", "event_ts"):
        typed.setdefault(key, {"value": None, "typed_value": None})  # missing
    return {
        "metadata": m,
        "value": encode(residual, names) if residual else None,
        "typed_value": typed,
    }


def dv_file(root: Path, rows: list[int]) -> dict[str, Any]:
    """A deletion vector file marking ``rows``, and its ``u`` descriptor."""
    bitmap = BitMap64(rows)
    data = struct.pack("<I", MAGIC_PORTABLE) + bitmap.serialize()
    dv_id = uuid.uuid4()
    content = b"\x01" + struct.pack(">I", len(data)) + data + struct.pack(">I", zlib.crc32(data))
    (root / f"deletion_vector_{dv_id}.bin").write_bytes(content)
    return {
        "storageType": "u",
        "pathOrInlineDv": encode_z85(dv_id.bytes),
        "offset": 1,
        "sizeInBytes": len(data),
        "cardinality": len(rows),
    }


def variant_table_with_dv(root: Path) -> list[Any]:
    """v0: a partitioned file of 5 shredded variants; v1: rows 1 and 3 deleted through a
    deletion vector (remove + add of the same file); v2: a second partition appended. The
    change data feed is on (no cdc files: changes come from the actions)."""
    values: list[Any] = [
        {"event_type": f"e{i}", "event_ts": i, "email": f"u{i}@x"} for i in range(4)
    ]
    values.append("not an object")
    rows = [shredded_event(v) for v in values]
    data = pa.table(
        {"id": pa.array(range(5), pa.int64()), "v": pa.array(rows, variant_type(EVENT))}
    )
    write_file(root, "part=a/f0.parquet", data)
    more = pa.table(
        {
            "id": pa.array([10], pa.int64()),
            "v": pa.array([shredded_event([1, 2])], variant_type(EVENT)),
        }
    )
    write_file(root, "part=b/f1.parquet", more)
    schema = schema_string([("id", "long"), ("part", "string"), ("v", "variant")])
    w = lb.LogWriter(root)
    w.commit(
        0,
        lb.commit_info(timestamp=1700000000000),
        VARIANT_PROTOCOL,
        metadata_action(schema, partition_columns=["part"]),
        add_action(root, "part=a/f0.parquet", {"part": "a"}),
    )
    dv = dv_file(root, [1, 3])
    w.commit(
        1,
        lb.commit_info(timestamp=1700000001000),
        {
            "remove": {
                "path": "part=a/f0.parquet",
                "deletionTimestamp": 1700000001000,
                "dataChange": True,
                "partitionValues": {"part": "a"},
            }
        },
        add_action(root, "part=a/f0.parquet", {"part": "a"}, dv=dv),
    )
    w.commit(
        2,
        lb.commit_info(timestamp=1700000002000),
        add_action(root, "part=b/f1.parquet", {"part": "b"}),
    )
    return [*values, [1, 2]]
