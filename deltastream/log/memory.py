"""The Arrow memory pool that large checkpoints are decoded into.

pyarrow's default pool is mimalloc. Decoding a parquet checkpoint grows each column's
buffers by reallocation, and mimalloc keeps a block that shrinks by less than half where it
is, so the decoded file actions of a 1 M-file checkpoint (about 430 MiB of Arrow data) held
about 700 MiB of resident memory, and its page handling cost more system time than the
decoding itself. jemalloc sizes them to within a few percent and is several times faster
there (measured on the 1 M-file snapshot benchmark; see docs/performance.md).

A library must not change the process's default pool (:func:`deltastream.runtime.use_fast_
allocator` does that for deltastream's own programs), so the checkpoint reader passes this
pool explicitly. Arrays remember the pool they came from, so mixing pools is safe. An
explicit ``ARROW_DEFAULT_MEMORY_POOL`` is obeyed here too, and a pyarrow built without
jemalloc falls back to the default pool.
"""

from __future__ import annotations

import os
from functools import cache

import pyarrow as pa

__all__ = ["decode_pool"]


@cache
def decode_pool() -> pa.MemoryPool:
    """jemalloc's pool unless the environment chose a pool or pyarrow lacks jemalloc; else
    the default pool."""
    if "ARROW_DEFAULT_MEMORY_POOL" not in os.environ:
        try:
            return pa.jemalloc_memory_pool()
        except NotImplementedError:  # a pyarrow build without jemalloc
            pass
    return pa.default_memory_pool()
