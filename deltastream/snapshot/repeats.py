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

import hashlib
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

#: Bounds of one slice of strings hashed together. Its work arrays (seven of one 64-bit
#: integer per word of its strings: about 1 MiB each at these bounds, 16 MiB at most with
#: their growth) are allocated once per call and reused: allocated afresh for each slice,
#: they cost more in page faults than the hashing (0.2 s for a million paths).
_SLICE_ROWS = 8_192
_SLICE_BYTES = 1 << 20
#: A string longer than this is hashed on its own (BLAKE2b), so that no slice's work arrays
#: grow past the bounds above whatever a log holds.
_LONG = 1 << 16

_SEED = secrets.randbits(64)
_KEY = _SEED.to_bytes(8, "little")
#: Odd multipliers of murmur3's 64-bit finaliser (fmix64) and a golden-ratio step.
_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S33 = np.uint64(33)


def _fmix(x: U64s, scratch: U64s | None = None) -> U64s:
    """murmur3's 64-bit finaliser, in place (``scratch``: a work array of x's size): every
    input bit affects every output bit."""
    tmp = np.empty_like(x) if scratch is None else scratch
    for multiplier in (_M1, _M2, None):
        np.right_shift(x, _S33, out=tmp)
        x ^= tmp
        if multiplier is not None:
            x *= multiplier
    return x


class _Work:
    """The work arrays of one :func:`fingerprints` call, grown to the largest slice."""

    def __init__(self) -> None:
        self.words = 0
        self.bytes = 0

    def reserve(self, words: int, nbytes: int) -> None:
        if words > self.words:
            self.words = max(words, 2 * self.words)
            self.index = np.arange(self.words, dtype=np.int64)
            self.i1 = np.empty(self.words, dtype=np.int64)
            self.i2 = np.empty(self.words, dtype=np.int64)
            self.i3 = np.empty(self.words, dtype=np.int64)
            self.u1 = np.empty(self.words, dtype=np.uint64)
            self.u2 = np.empty(self.words, dtype=np.uint64)
            # A key per word position, so that equal words at different positions differ.
            keys = np.arange(1, self.words + 1, dtype=np.uint64)
            keys *= _GOLDEN
            keys += np.uint64(_SEED)
            self.keys = _fmix(keys)
        if nbytes > self.bytes:
            self.bytes = max(nbytes, 2 * self.bytes)
            self.padded = np.zeros(self.bytes, dtype=np.uint8)


def _hash_slice(data: npt.NDArray[np.uint8], offsets: I64s, work: _Work) -> U64s:
    """Fingerprints of the strings ``data[offsets[i]:offsets[i + 1]]``.

    A string of L bytes is read as ceil(L / 8) little-endian words (at least one), its last
    word holding only its own bytes; word k is keyed by its position and mixed, the mixed
    words are summed per string, and the sum is mixed with the length.
    """
    lo, hi = int(offsets[0]), int(offsets[-1])
    lengths = np.diff(offsets)
    words = np.maximum((lengths + 7) >> 3, 1)
    ends = np.cumsum(words)
    firsts = ends - words
    total = int(ends[-1])
    work.reserve(total, hi - lo + 16)
    # The bytes with eight zero bytes either side, so that every eight-byte read below stays
    # inside: the word ending at a short string's end may start before it (its extra bytes
    # are shifted out).
    padded = work.padded[: hi - lo + 16]
    padded[:8] = 0
    padded[8 : 8 + hi - lo] = data[lo:hi]
    padded[8 + hi - lo :] = 0
    # Every eight-byte window of ``padded`` as one uint64, read unaligned (no copy).
    windows = np.ndarray(shape=(len(padded) - 7,), dtype="<u8", buffer=padded, strides=(1,))
    starts = offsets[:-1] - (lo - 8)
    # Word k of string i, at index j = firsts[i] + k, starts at byte starts[i] + 8k.
    string = work.i1[:total]  # i for each j
    string.fill(0)
    string[firsts[1:]] = 1
    np.cumsum(string, out=string)
    k = work.i2[:total]
    np.take(firsts, string, out=k)
    np.subtract(work.index[:total], k, out=k)
    position = work.i3[:total]
    np.take(starts, string, out=position)
    np.left_shift(k, 3, out=string)
    position += string
    values = work.u1[:total]
    values[:] = windows[position]
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
    keyed = work.u2[:total]
    np.take(work.keys, k, out=keyed)
    values ^= keyed
    sums = np.add.reduceat(_fmix(values, keyed), firsts)
    sums ^= lengths.astype(np.uint64) * _GOLDEN
    return _fmix(sums)


def _hash_long(data: npt.NDArray[np.uint8]) -> np.uint64:
    """The fingerprint of one long string: BLAKE2b keyed with the process's seed."""
    digest = hashlib.blake2b(data.tobytes(), digest_size=8, key=_KEY).digest()
    return np.uint64(int.from_bytes(digest, "little"))


def _chunk_fingerprints(
    chunk_offsets: npt.NDArray[np.integer[Any]], data: npt.NDArray[np.uint8], work: _Work
) -> U64s:
    """Fingerprints of the strings of one chunk (nulls included), slice by slice."""
    # int64: int32 offsets plus a slice's bytes could overflow.
    offsets: I64s = chunk_offsets.astype(np.int64)
    n = len(offsets) - 1
    out = np.empty(n, dtype=np.uint64)
    long_rows = np.flatnonzero(np.diff(offsets) > _LONG)
    start = 0
    while start < n:
        following = int(np.searchsorted(long_rows, start))  # the next long string's index
        if following < len(long_rows) and long_rows[following] == start:
            out[start] = _hash_long(data[offsets[start] : offsets[start + 1]])
            start += 1
            continue
        # At most _SLICE_ROWS strings and _SLICE_BYTES bytes (or one string), none long.
        stop = min(n, start + _SLICE_ROWS)
        if following < len(long_rows):
            stop = min(stop, int(long_rows[following]))
        limit = offsets[start] + _SLICE_BYTES
        if offsets[stop] > limit:
            stop = max(start + 1, int(np.searchsorted(offsets, limit, side="right")) - 1)
        out[start:stop] = _hash_slice(data, offsets[start : stop + 1], work)
        start = stop
    return out


def fingerprints(strings: AnyArray) -> U64s:
    """A 64-bit fingerprint of each value of a string (or binary) column; equal values have
    equal fingerprints within a process. Nulls get some fingerprint: mask them out."""
    chunks = string_chunks(strings)
    if chunks is None:
        chunks = cast(Iterator[StringChunk], string_chunks(pc.cast(strings, pa.large_string())))
    work = _Work()
    parts = [_chunk_fingerprints(offsets, data, work) for offsets, data in chunks]
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
