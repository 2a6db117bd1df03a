"""Finding a string that a column holds more than once, without a copy of its strings.

A checkpoint's paths must be distinct (a data file live twice would have its rows read
twice). Asking Arrow (``pc.unique``, ``pc.value_counts``) builds a hash table holding a
copy of every distinct string and then an array of them: for the million paths of a 1 M-file
checkpoint about 240 MiB of memory and, on a shared 2-core machine, up to a second.

Here each string gets a 64-bit fingerprint computed by numpy from the column's own
buffers, eight bytes at a time, in slices of bounded size (a few MiB of temporaries); the
fingerprints are sorted, and only the rows whose fingerprint occurs more than once are
compared as strings. Equal strings always have equal fingerprints, so no repeat is missed;
distinct strings whose fingerprints collide are told apart by that exact comparison, so
none is reported wrongly. The fingerprint is keyed with a random seed drawn once per
process, so a log cannot be written to make its paths collide (which would only cost time:
the exact comparison then covers those rows).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any, TypeAlias, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from deltastream.log.string_buffers import StringChunk, string_chunks

__all__ = ["fingerprints", "first_repeated"]

AnyArray: TypeAlias = "pa.ChunkedArray[Any] | pa.Array[Any]"
U64s: TypeAlias = "npt.NDArray[np.uint64]"
I64s: TypeAlias = "npt.NDArray[np.int64]"

#: Bounds of one slice of strings hashed together: its temporaries are a few arrays of one
#: uint64 per eight bytes of its strings.
_SLICE_ROWS = 1 << 16
_SLICE_BYTES = 4 << 20

_SEED = np.uint64(secrets.randbits(64))
#: Odd multipliers of murmur3's 64-bit finaliser (fmix64) and a golden-ratio step.
_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S33 = np.uint64(33)


def _fmix(x: U64s) -> U64s:
    """murmur3's 64-bit finaliser, in place: every input bit affects every output bit."""
    x ^= x >> _S33
    x *= _M1
    x ^= x >> _S33
    x *= _M2
    x ^= x >> _S33
    return x


def _word_keys(n: int) -> U64s:
    """A key per word position 0..n-1, so that equal words at different positions differ."""
    keys = np.arange(1, n + 1, dtype=np.uint64)
    keys *= _GOLDEN
    keys += _SEED
    return _fmix(keys)


def _hash_slice(data: npt.NDArray[np.uint8], offsets: I64s) -> U64s:
    """Fingerprints of the strings ``data[offsets[i]:offsets[i + 1]]``.

    A string of L bytes is read as ceil(L / 8) little-endian words (at least one), its last
    word holding only its own bytes; word k is keyed by its position and mixed, the mixed
    words are summed per string, and the sum is mixed with the length.
    """
    lo, hi = int(offsets[0]), int(offsets[-1])
    # The bytes with eight zero bytes either side, so that every eight-byte read below stays
    # inside: the word ending at a short string's end may start before it (its extra bytes
    # are shifted out).
    padded = np.zeros(hi - lo + 16, dtype=np.uint8)
    padded[8 : 8 + hi - lo] = data[lo:hi]
    # Every eight-byte window of ``padded`` as one uint64, read unaligned (no copy).
    windows = np.ndarray(shape=(len(padded) - 7,), dtype="<u8", buffer=padded, strides=(1,))
    starts = offsets[:-1] - (lo - 8)
    lengths = np.diff(offsets)
    words = np.maximum((lengths + 7) >> 3, 1)
    ends = np.cumsum(words)
    firsts = ends - words
    total = int(ends[-1])
    # Word k of string i starts at byte starts[i] + 8k; index j = firsts[i] + k.
    position = np.arange(total, dtype=np.int64)
    k = position - np.repeat(firsts, words)
    position = k * 8
    position += np.repeat(starts, words)
    values = windows[position].astype(np.uint64, copy=False)
    # A last word that is partial: the eight bytes ending at the string's end, shifted so
    # that only the string's own bytes remain; an empty string is one word of zeros.
    tail = lengths & 7
    partial = np.flatnonzero(tail)
    if len(partial):
        shift = ((8 - tail[partial]) * 8).astype(np.uint64)
        ending = starts[partial] + lengths[partial] - 8
        values[ends[partial] - 1] = windows[ending] >> shift
    empty = np.flatnonzero(lengths == 0)
    if len(empty):
        values[firsts[empty]] = 0
    values ^= _word_keys(int(words.max()))[k]
    sums = np.add.reduceat(_fmix(values), firsts)
    sums ^= lengths.astype(np.uint64) * _GOLDEN
    return _fmix(sums)


def _chunk_fingerprints(
    chunk_offsets: npt.NDArray[np.integer[Any]], data: npt.NDArray[np.uint8]
) -> U64s:
    """Fingerprints of the strings of one chunk (nulls included), slice by slice."""
    # int64: int32 offsets plus a slice's bytes could overflow.
    offsets: I64s = chunk_offsets.astype(np.int64)
    n = len(offsets) - 1
    out = np.empty(n, dtype=np.uint64)
    start = 0
    while start < n:
        # At most _SLICE_ROWS strings and, unless one string is larger, _SLICE_BYTES bytes.
        stop = min(n, start + _SLICE_ROWS)
        limit = offsets[start] + _SLICE_BYTES
        if offsets[stop] > limit:
            stop = max(start + 1, int(np.searchsorted(offsets, limit, side="right")) - 1)
        out[start:stop] = _hash_slice(data, offsets[start : stop + 1])
        start = stop
    return out


def fingerprints(strings: AnyArray) -> U64s:
    """A 64-bit fingerprint of each value of a string (or binary) column; equal values have
    equal fingerprints within a process. Nulls get some fingerprint: mask them out."""
    chunks = string_chunks(strings)
    if chunks is None:
        chunks = cast(Iterator[StringChunk], string_chunks(pc.cast(strings, pa.large_string())))
    parts = [_chunk_fingerprints(offsets, data) for offsets, data in chunks]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)


def first_repeated(strings: AnyArray) -> Any | None:
    """A value that ``strings`` holds more than once (nulls aside), if any: of those, the
    one whose first occurrence comes first (as ``pc.value_counts`` orders them)."""
    if len(strings) - strings.null_count < 2:
        return None
    if string_chunks(strings) is None:  # string_view and the like: taken below as well
        strings = pc.cast(strings, pa.large_string())
    prints = fingerprints(strings)
    valid = np.ones(len(prints), dtype=np.bool_)
    if strings.null_count:
        valid = np.asarray(pc.is_valid(strings).to_numpy(zero_copy_only=False), dtype=np.bool_)
    ordered = np.sort(prints[valid] if strings.null_count else prints)
    same = ordered[1:] == ordered[:-1]
    if not same.any():
        return None
    # Only the rows sharing a fingerprint are compared as strings, in their original order.
    rows = np.flatnonzero(valid & np.isin(prints, ordered[1:][same]))
    candidates = _take(strings, rows)
    counts = pc.value_counts(candidates)
    repeated = counts.filter(pc.greater(counts.field("counts"), pa.scalar(1, pa.int64())))
    return repeated.field("values")[0].as_py() if len(repeated) else None


def _take(strings: AnyArray, rows: I64s) -> pa.Array[Any]:
    """``strings[rows]`` (rows ascending), taken chunk by chunk: taking from a chunked array
    at once would first concatenate all its chunks."""
    chunks = strings.chunks if isinstance(strings, pa.ChunkedArray) else [strings]
    taken: list[pa.Array[Any]] = []
    start = 0
    for chunk in chunks:
        stop = start + len(chunk)
        a, b = np.searchsorted(rows, [start, stop])
        if b > a:
            taken.append(chunk.take(rows[a:b] - start))
        start = stop
    return pa.concat_arrays(taken) if taken else pa.array([], type=strings.type)
