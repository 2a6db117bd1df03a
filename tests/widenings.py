"""The protocol's type widenings (PROTOCOL-upstream.md, "Type Widening") as test data: every
supported change with narrow values around a boundary and wide values beyond the narrow
range, each type's Arrow form, a value's statistic as Spark writes it, and the protocol's
conversion of a narrow value to the wider type. Used by the reader's widening tests
(``tests/schema/test_widening.py``) and the sinks' schema-evolution tests
(``tests/daemon/test_schema_targets.py``)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["WIDENINGS", "arrow_type", "stat", "widened"]

D = decimal.Decimal


def arrow_type(name: str) -> pa.DataType:
    if name.startswith("decimal("):
        p, s = name[8:-1].split(",")
        return pa.decimal128(int(p), int(s))
    return {
        "byte": pa.int8(),
        "short": pa.int16(),
        "integer": pa.int32(),
        "long": pa.int64(),
        "float": pa.float32(),
        "double": pa.float64(),
        "date": pa.date32(),
        "timestamp_ntz": pa.timestamp("us"),
        "string": pa.string(),
    }[name]


def stat(value: Any, type_name: str) -> Any:
    """A statistic as Spark writes it for a value of ``type_name``."""
    if type_name == "float":
        return json.loads(str(np.float32(value)))  # the float's shortest text
    if isinstance(value, dt.datetime):
        return value.isoformat(timespec="milliseconds")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, D):
        return float(value) if abs(value) < 1e15 else str(value)
    return value


def widened(value: Any, to: str) -> Any:
    """The protocol's conversion of a narrow value to the wider type ``to``."""
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return dt.datetime(value.year, value.month, value.day)
    if to.startswith("decimal("):
        scale = int(to[8:-1].split(",")[1])
        return D(value).quantize(D(1).scaleb(-scale))
    if to == "double":
        return float(np.float32(value)) if isinstance(value, float) else float(value)
    return value


#: Every change the protocol lists, with narrow values around a boundary ``b`` (a value of
# the narrow type, written as the wide type's literal) and wide values beyond the narrow range.
WIDENINGS = [
    ("byte", "short", [-128, 5, 127], [300, -300], "5"),
    ("byte", "integer", [-128, 5, 127], [70_000], "5"),
    ("byte", "long", [-128, 5, 127], [2**40], "5"),
    ("short", "integer", [-32768, 7, 32767], [70_000], "7"),
    ("short", "long", [-32768, 7, 32767], [2**40], "7"),
    ("integer", "long", [-(2**31), 9, 2**31 - 1], [2**40, -(2**63)], "9"),
    ("float", "double", [-1.5, 3.4, 1e30], [1.234567890123, 3.4], "3.4"),
    ("byte", "double", [-128, 5, 127], [0.5], "5"),
    ("short", "double", [-32768, 7, 32767], [0.25], "7"),
    ("integer", "double", [-(2**31), 9, 2**31 - 1], [1e300], "9"),
    (
        "date",
        "timestamp_ntz",
        [dt.date(1, 1, 1), dt.date(2024, 9, 9), dt.date(9999, 12, 31)],
        [dt.datetime(2024, 9, 9, 12, 34, 56, 123000)],
        "'2024-09-09 00:00:00'",
    ),
    (
        "decimal(5,2)",
        "decimal(7,2)",
        [D("-999.99"), D("1.25"), D("999.99")],
        [D("12345.67")],
        "1.25",
    ),
    (
        "decimal(5,2)",
        "decimal(10,4)",
        [D("-999.99"), D("1.25"), D("999.99")],
        [D("123456.7891")],
        "1.25",
    ),
    ("byte", "decimal(10,0)", [-128, 5, 127], [D("9999999999")], "5"),
    ("short", "decimal(12,2)", [-32768, 7, 32767], [D("1234567890.12")], "7"),
    ("integer", "decimal(11,1)", [-(2**31), 9, 2**31 - 1], [D("1234567890.1")], "9"),
    ("long", "decimal(20,0)", [-(2**63), 11, 2**63 - 1], [D("99999999999999999999")], "11"),
    ("long", "decimal(22,2)", [-(2**63), 11, 2**63 - 1], [D("0.01")], "11"),
]
