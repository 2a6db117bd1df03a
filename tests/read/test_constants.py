"""Repeated-value arrays: the right values and types whatever was cached before, and a
cache that stays bounded."""

from __future__ import annotations

import datetime as dt
import decimal
import math

import pyarrow as pa

from deltastream.read import constants
from deltastream.read.constants import repeated


def test_values_types_and_lengths() -> None:
    utc = dt.UTC
    cases = [
        ("insert", pa.string()),
        (7, pa.int64()),
        (dt.datetime(2026, 1, 2, tzinfo=utc), pa.timestamp("us", tz="UTC")),
        (decimal.Decimal("1.50"), pa.decimal128(5, 2)),
        (b"\x00\x01", pa.binary()),
        (None, pa.int32()),
    ]
    for value, arrow_type in cases:
        for n in (3, 0, 70_000, 5):  # shorter after longer: a slice of the cached array
            got = repeated(value, arrow_type, n)
            assert got.type == arrow_type and len(got) == n
            assert got.to_pylist() == [value] * n


def test_values_equal_in_python_are_not_confused() -> None:
    """0.0 == -0.0, 1 == True and NaN != NaN must not share (or miss) cache entries."""
    assert math.copysign(1, repeated(0.0, pa.float64(), 2)[0].as_py()) == 1
    assert math.copysign(1, repeated(-0.0, pa.float64(), 2)[0].as_py()) == -1
    assert repeated(1, pa.int8(), 2).to_pylist() == [1, 1]
    assert repeated(True, pa.bool_(), 2).to_pylist() == [True, True]
    assert all(math.isnan(v) for v in repeated(math.nan, pa.float64(), 3).to_pylist())


def test_cache_stays_bounded() -> None:
    for i in range(1_000):
        repeated(i, pa.int64(), 65_536)
        repeated("x" * 1_000 + str(i), pa.string(), 4_096)
    assert len(constants._cache) <= constants._MAX_ENTRIES
    assert constants._cached_bytes <= constants._MAX_BYTES
    assert constants._cached_bytes == sum(a.nbytes for a in constants._cache.values())
