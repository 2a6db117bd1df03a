"""Writing record batches out: JSON lines and parquet files.

JSON values: timestamps and dates in ISO-8601 (UTC timestamps with ``+00:00``), decimals as
strings (exact, fixed-point with the column's scale: ``"0.0000000000"`` for a
``decimal(20,10)`` zero, never exponent notation), binary as base64, maps as objects (keys
as strings), NaN/Infinity as the strings ``"NaN"``/``"Infinity"``/``"-Infinity"`` (JSON has
no such numbers), variants (at any depth) as the JSON value they hold
(:func:`~deltastream.read.variant.variant_to_json`).
A parquet output is written to a temporary file beside the target and renamed into place
only when complete, so a failed run never leaves a partial file under the target name.
Output files get the permissions the umask leaves, as any file a program opens for writing
(:func:`create_temp_file`; the sinks' files too).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
import os
import secrets
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from deltastream.read.variant import variant_to_json
from deltastream.schema.model import is_variant_arrow

__all__ = [
    "batch_to_json_lines",
    "create_temp_file",
    "json_text_array",
    "json_value",
    "write_json_lines",
    "write_parquet",
]


def json_value(value: Any) -> Any:
    """A JSON-encodable form of one Arrow value (as ``to_pylist`` returns it)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        # Fixed-point, with the digits of the column's scale (the exponent of the Decimal
        # Arrow gives): str() would give exponent notation, "0E-10" for a decimal(20,10) 0.
        return format(value, "f")
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return str(value)


def batch_to_json_lines(batch: pa.RecordBatch) -> Iterator[str]:
    variants = [(f.name, f.type) for f in batch.schema if _has_variant(f.type)]
    for row in batch.to_pylist(maps_as_pydicts="lossy"):
        for name, t in variants:
            row[name] = _decode_variants(row[name], t)
        yield json.dumps({k: json_value(v) for k, v in row.items()}, ensure_ascii=False)


def json_text_array(array: pa.Array[Any]) -> pa.Array[Any]:
    """Each value of ``array`` (a struct, list, map or variant column) as JSON text, with the
    values' JSON forms of :func:`json_value` (variants as the JSON they hold); nulls stay
    null. For targets that store nested values as JSON (PostgreSQL's ``jsonb``)."""
    t = array.type
    variant = _has_variant(t)
    texts: list[str | None] = []
    for value in array.to_pylist(maps_as_pydicts="lossy"):
        if value is None:
            texts.append(None)
            continue
        if variant:
            value = _decode_variants(value, t)
        texts.append(orjson.dumps(json_value(value)).decode())
    return pa.array(texts, pa.string())


def _has_variant(t: pa.DataType) -> bool:
    if is_variant_arrow(t):
        return True
    if pa.types.is_struct(t):
        return any(_has_variant(f.type) for f in t)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_variant(t.value_type)
    if pa.types.is_map(t):
        return _has_variant(t.item_type)
    return False


def _decode_variants(value: Any, t: pa.DataType) -> Any:
    """``value`` (as ``to_pylist`` gives it) with each variant in it as the JSON value it
    holds (variants are told apart by the marker on their Arrow type)."""
    if value is None:
        return None
    if is_variant_arrow(t):
        return json.loads(variant_to_json(value["metadata"], value["value"]))
    if pa.types.is_struct(t):
        return {f.name: _decode_variants(value[f.name], f.type) for f in t}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [_decode_variants(v, t.value_type) for v in value]
    if pa.types.is_map(t):
        return {k: _decode_variants(v, t.item_type) for k, v in value.items()}
    return value


def write_json_lines(batches: Iterable[pa.RecordBatch], out: TextIO) -> int:
    """Write every row as one JSON object per line; returns the number of rows."""
    rows = 0
    for batch in batches:
        for line in batch_to_json_lines(batch):
            out.write(line + "\n")
        rows += batch.num_rows
    out.flush()
    return rows


def create_temp_file(directory: str | os.PathLike[str], prefix: str, suffix: str) -> str:
    """A new, empty file ``{prefix}XXXXXXXX{suffix}`` (8 random hex digits) in ``directory``,
    with the permissions the umask leaves of 0666, as ``open(path, "w")`` gives: unlike
    ``tempfile.mkstemp``'s 0600, which a file renamed into place as an output would keep."""
    for _ in range(100):
        path = os.path.join(directory, f"{prefix}{secrets.token_hex(4)}{suffix}")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            continue
        os.close(fd)
        return path
    raise FileExistsError(f"{directory}: no free name for a temporary file {prefix}*{suffix}")


def write_parquet(schema: pa.Schema, batches: Iterable[pa.RecordBatch], path: str) -> int:
    """Write all batches to one parquet file at ``path`` atomically; returns the row count."""
    target = os.path.abspath(path)
    directory = os.path.dirname(target)
    os.makedirs(directory, exist_ok=True)
    tmp = create_temp_file(directory, ".deltastream-", ".parquet.tmp")
    rows = 0
    try:
        with pq.ParquetWriter(tmp, schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
                rows += batch.num_rows
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise
    return rows
