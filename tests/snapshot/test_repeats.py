"""``first_repeated`` and its fingerprints: a repeated string is found however the column is
laid out (chunks, slices, large types, strings across the hashing slices), none is reported
that is not there, even when fingerprints collide, and the first repeated comes first."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from deltastream.snapshot import repeats
from deltastream.snapshot.repeats import fingerprints, first_repeated


def _value_counts_first(values: list[Any]) -> Any:
    """What the check found before fingerprints: Arrow's first repeated value."""
    counts = pc.value_counts(pc.drop_null(pa.array(values)))
    repeated = counts.filter(pc.greater(counts.field("counts"), 1))
    return repeated.field("values")[0].as_py() if len(repeated) else None


def _strings(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    lengths = [0, 1, 5, 7, 8, 9, 15, 16, 17, 63, 64, 65, 300]
    return [
        "".join(rng.choice("ab/=%:é") for _ in range(rng.choice(lengths))) + f"#{i}"
        for i in range(n)
    ]


def test_distinct_strings_have_no_repeat() -> None:
    values = _strings(5000, 1)
    assert first_repeated(pa.array(values)) is None
    assert len(np.unique(fingerprints(pa.array(values)))) == len(values)


@pytest.mark.parametrize("type_", [pa.string(), pa.large_string(), pa.binary()])
def test_equal_strings_have_equal_fingerprints_wherever_they_are(type_: pa.DataType) -> None:
    values = _strings(3000, 2)
    values = [v.encode() for v in values] if type_ == pa.binary() else values
    whole = pa.array(values, type=type_)
    # The same values in other chunks, sliced at other offsets.
    chunked = pa.chunked_array([whole.slice(0, 1000), whole.slice(1000, 1), whole.slice(1001)])
    padded = pa.array([values[0], *values, values[-1]], type=type_).slice(1, len(values))
    expected = fingerprints(whole)
    assert np.array_equal(fingerprints(chunked), expected)
    assert np.array_equal(fingerprints(padded), expected)


def test_fingerprints_tell_apart_what_words_would_not() -> None:
    # Same words in another order, a trailing NUL, the empty string, lengths across words.
    values = ["a" * 8 + "b" * 8, "b" * 8 + "a" * 8, "x", "x\x00", "", "\x00", "y" * 8, "y" * 9]
    assert len(set(fingerprints(pa.array(values)).tolist())) == len(values)


@pytest.mark.parametrize("at", [0, 1, 4095, 4096, 9999])
def test_a_repeat_is_found_anywhere(at: int) -> None:
    values = _strings(10_000, 3)
    values.append(values[at])
    random.Random(at).shuffle(values)
    column = pa.chunked_array([pa.array(values[:6000]), pa.array(values[6000:])])
    assert first_repeated(column) == _value_counts_first(values)


def test_the_first_repeated_comes_first_and_nulls_do_not_count() -> None:
    values = [None, "c", "a", None, "b", "a", "c", "b"]
    assert first_repeated(pa.array(values)) == "c" == _value_counts_first(values)
    assert first_repeated(pa.array([None, None, "a"])) is None
    assert first_repeated(pa.array(["", ""])) == ""


def test_slices_of_bounded_size(monkeypatch: pytest.MonkeyPatch) -> None:
    # Small slices: strings longer than a slice, repeats across slices.
    monkeypatch.setattr(repeats, "_SLICE_ROWS", 7)
    monkeypatch.setattr(repeats, "_SLICE_BYTES", 40)
    values = _strings(500, 4)
    expected = fingerprints(pa.array(values))
    monkeypatch.undo()
    assert np.array_equal(expected, fingerprints(pa.array(values)))
    monkeypatch.setattr(repeats, "_SLICE_ROWS", 7)
    monkeypatch.setattr(repeats, "_SLICE_BYTES", 40)
    assert first_repeated(pa.array([*values, values[3]])) == values[3]


def test_long_strings_are_hashed_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(repeats, "_LONG", 20)
    values = _strings(400, 6)
    assert any(len(v.encode()) > 20 for v in values) and any(len(v) <= 20 for v in values)
    whole = pa.array(values)
    chunked = pa.chunked_array([whole.slice(0, 150), whole.slice(150)])
    assert np.array_equal(fingerprints(whole), fingerprints(chunked))
    assert len(set(fingerprints(whole).tolist())) == len(values)
    long = next(v for v in values if len(v.encode()) > 20)
    assert first_repeated(pa.array([*values, long])) == long


def test_colliding_fingerprints_are_compared_as_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every fingerprint equal: only the exact comparison decides.
    monkeypatch.setattr(
        repeats, "fingerprints", lambda strings: np.zeros(len(strings), dtype=np.uint64)
    )
    values = _strings(2000, 5)
    assert first_repeated(pa.array(values)) is None
    values.insert(700, values[1500])
    assert first_repeated(pa.chunked_array([pa.array(values[:900]), pa.array(values[900:])])) == (
        _value_counts_first(values)
    )


def test_other_types_are_cast() -> None:
    assert first_repeated(pa.array(["a", "b", "a"], type=pa.string_view())) == "a"
    assert first_repeated(pa.array(["a", "b"], type=pa.string_view())) is None
