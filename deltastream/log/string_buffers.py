"""The bytes of Arrow string columns as numpy arrays, without copying them.

Some checks over a million paths (a NUL byte in any, a ``:`` that might make one absolute, a
path named twice) are cheapest as numpy scans of the column's data buffer: a regex or a hash
table over every string costs several times more, and a hash table holds a copy of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeAlias, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa

__all__ = ["StringChunk", "string_chunks"]

AnyArray: TypeAlias = "pa.ChunkedArray[Any] | pa.Array[Any]"

#: One chunk's strings: ``data[offsets[i]:offsets[i + 1]]`` is string i (a null's bytes
#: are whatever the buffer holds there, usually none). ``offsets`` are int32 or int64.
StringChunk: TypeAlias = "tuple[npt.NDArray[np.integer[Any]], npt.NDArray[np.uint8]]"

_EMPTY = np.zeros(0, dtype=np.uint8)


def string_chunks(strings: AnyArray) -> Iterator[StringChunk] | None:
    """The non-empty chunks of a ``string``/``binary`` column (or their ``large_`` kinds) as
    offsets and bytes, sharing the column's buffers; None for any other type."""
    t = strings.type
    wide = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
    if not (wide or pa.types.is_string(t) or pa.types.is_binary(t)):
        return None
    chunks = strings.chunks if isinstance(strings, pa.ChunkedArray) else [strings]
    return _iter_chunks(chunks, np.dtype(np.int64 if wide else np.int32))


def _iter_chunks(chunks: list[pa.Array[Any]], offset_type: np.dtype[Any]) -> Iterator[StringChunk]:
    for chunk in chunks:
        n = len(chunk)
        if not n:
            continue
        buffers = chunk.buffers()
        offsets = np.frombuffer(memoryview(cast(pa.Buffer, buffers[1])), dtype=offset_type)
        raw = buffers[2]
        data = _EMPTY if raw is None else np.frombuffer(memoryview(raw), dtype=np.uint8)
        yield offsets[chunk.offset : chunk.offset + n + 1], data
