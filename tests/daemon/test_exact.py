"""The one rule saying whether a target column holds every value of a source column
(deltastream.daemon.sinks.exact), over the protocol's widenings and the cases a sink meets."""

from __future__ import annotations

import pyarrow as pa
import pytest

from deltastream.daemon.sinks.exact import JSON, Fit, fit, type_name

UTC = pa.timestamp("us", "UTC")
NTZ = pa.timestamp("us")

HOLDS = [
    (pa.int32(), pa.int32()),
    (pa.int8(), pa.int16()),
    (pa.int32(), pa.int64()),
    (pa.int32(), pa.float64()),
    (pa.int16(), pa.decimal128(5, 0)),
    (pa.int64(), pa.decimal128(20, 0)),
    (pa.int64(), pa.decimal256(76, 38)),  # PostgreSQL's numeric without a typmod
    (pa.float32(), pa.float64()),
    (pa.decimal128(10, 2), pa.decimal128(12, 4)),
    (pa.decimal128(38, 10), pa.decimal256(76, 38)),
    (pa.date32(), NTZ),
    (pa.string(), pa.large_string()),
    (UTC, UTC),
    (UTC, pa.timestamp("ns", "UTC")),
    (pa.struct([("a", pa.int32())]), JSON),
    (pa.list_(pa.int32()), JSON),
    (pa.map_(pa.string(), pa.int32()), JSON),
    (pa.struct([("a", pa.int32())]), pa.struct([("a", pa.int64()), ("b", pa.string())])),
]

REFUSED = [
    (pa.int64(), pa.int32()),
    (pa.int64(), pa.float64()),  # 2**62 + 1 is no double
    (pa.int64(), pa.decimal128(19, 0)),  # the protocol asks 20 digits of a long
    (pa.float64(), pa.float32()),
    (pa.float64(), pa.decimal256(76, 38)),
    (pa.decimal128(12, 4), pa.decimal128(12, 2)),
    (pa.decimal128(12, 4), pa.float64()),
    (pa.string(), JSON),
    (pa.string(), pa.binary()),
    (UTC, NTZ),
    (NTZ, UTC),
    (UTC, pa.timestamp("ms", "UTC")),
    (pa.struct([("a", pa.int32())]), pa.string()),
    (pa.list_(pa.int64()), pa.list_(pa.int32())),
]


@pytest.mark.parametrize(("source", "target"), HOLDS, ids=str)
def test_holds(source: pa.DataType, target: pa.DataType) -> None:
    assert fit(source, target, "c").holds


@pytest.mark.parametrize(("source", "target"), REFUSED, ids=str)
def test_refused_names_the_column_and_both_types(source: pa.DataType, target: pa.DataType) -> None:
    result = fit(source, target, "c")
    assert not result.holds
    assert result.added == ()
    if result.widened:  # narrower than the source, by a widening the protocol lists
        assert result.widened[0][0].startswith("c")
    else:
        assert result.refused[0][0].startswith("c")


def test_a_narrower_type_the_protocol_widens_is_to_be_widened() -> None:
    assert fit(pa.int64(), pa.int32(), "n") == Fit(widened=(("n", "integer", "long"),))
    assert fit(pa.decimal128(12, 4), pa.decimal128(10, 2), "d") == Fit(
        widened=(("d", "decimal(10,2)", "decimal(12,4)"),)
    )
    assert fit(pa.float64(), pa.float32(), "f").widened == (("f", "float", "double"),)
    # No widening makes a long a double, or a double a decimal: refused outright.
    assert fit(pa.int64(), pa.float64(), "x").refused == (("x", "double", "long"),)
    assert fit(pa.float64(), pa.decimal128(38, 10), "x").refused == (
        ("x", "decimal(38,10)", "double"),
    )


def test_nested_fields_added_and_widened_by_path() -> None:
    source = pa.struct(
        [("a", pa.int64()), ("b", pa.string()), ("l", pa.list_(pa.struct([("z", pa.int8())])))]
    )
    target = pa.struct([("a", pa.int32()), ("l", pa.list_(pa.struct([("y", pa.int8())])))])
    assert fit(source, target, "s") == Fit(
        added=("s.b", "s.l.element.z"), widened=(("s.a", "integer", "long"),)
    )


def test_type_names_are_deltas() -> None:
    assert type_name(pa.int16()) == "short"
    assert type_name(UTC) == "timestamp"
    assert type_name(NTZ) == "timestamp_ntz"
    assert type_name(pa.timestamp("ms")) == "timestamp_ntz[ms]"
    assert type_name(pa.map_(pa.string(), pa.list_(pa.int32()))) == "map<string,array<integer>>"
    assert type_name(JSON) == "json"
