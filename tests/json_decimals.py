"""Decimal columns and the JSON text deltastream writes for their values: exact strings,
fixed-point with the column's scale, never exponent notation (a ``decimal(20,10)`` zero is
``"0.0000000000"``, not ``"0E-10"``). The expected texts are written out here, apart from
the code under test; the tests of each path that writes JSON (``deltastream.output``, the
CLI's ``-o -``, the jsonl, http and PostgreSQL ``jsonb`` sinks) use them."""

from __future__ import annotations

import decimal
from typing import Any

import pyarrow as pa

__all__ = ["DECIMALS", "decimal_table", "expected_rows"]

#: column: (type, values as Decimal texts, the JSON strings of those values)
DECIMALS: dict[str, tuple[pa.DataType, list[str], list[str]]] = {
    "d20_10": (
        pa.decimal128(20, 10),
        ["0", "-1E-10", "9999999999.9999999999"],
        ["0.0000000000", "-0.0000000001", "9999999999.9999999999"],
    ),
    "d5_0": (
        pa.decimal128(5, 0),
        ["1E+3", "-99999", "0"],
        ["1000", "-99999", "0"],
    ),
    "d38_0": (
        pa.decimal128(38, 0),
        ["1E+37", "-99999999999999999999999999999999999999", "7"],
        ["1" + "0" * 37, "-" + "9" * 38, "7"],
    ),
    "d38_38": (
        pa.decimal128(38, 38),
        ["1E-38", "-0." + "9" * 38, "0"],
        ["0." + "0" * 37 + "1", "-0." + "9" * 38, "0." + "0" * 38],
    ),
    "d10_2": (
        pa.decimal128(10, 2),
        ["-0.5", "12345678.9", "1E+2"],
        ["-0.50", "12345678.90", "100.00"],
    ),
}


def decimal_table() -> pa.Table:
    """One column per entry of :data:`DECIMALS`, three rows."""
    return pa.table(
        {
            name: pa.array([decimal.Decimal(v) for v in values], t)
            for name, (t, values, _) in DECIMALS.items()
        }
    )


def expected_rows() -> list[dict[str, Any]]:
    """The rows of :func:`decimal_table` as JSON objects."""
    return [
        {name: texts[i] for name, (_, _, texts) in DECIMALS.items()}
        for i in range(len(next(iter(DECIMALS.values()))[2]))
    ]
