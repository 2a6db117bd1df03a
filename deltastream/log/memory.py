"""The Arrow memory pool that large checkpoints are decoded into.

pyarrow's default pool is mimalloc. Decoding a parquet checkpoint in batches, it kept 1.6 to
1.8 times the decoded bytes resident (the file actions of a 1 M-file checkpoint, about 430
MiB of Arrow buffers, held about 750 MiB), and its page handling cost more system time than
the decoding itself (1.2 to 1.9 s against 0.4 s of user time on a loaded 2-core machine).
jemalloc holds about 1.15 times the bytes and spends a fifth of that system time.

A library must not change the process's default pool
(:func:`deltastream.runtime.use_fast_allocator` does that for deltastream's own programs),
so the checkpoint reader passes this pool explicitly. Arrays keep the pool they came from,
so mixing pools is safe. An explicit ``ARROW_DEFAULT_MEMORY_POOL`` is obeyed here too, and a
pyarrow built without jemalloc falls back to the default pool.
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
