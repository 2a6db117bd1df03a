"""Reading files through :func:`deltastream.read.pipeline.read_file_batches`, for the
pipeline's and the native scan's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa

from deltastream.read.pipeline import read_file_batches
from deltastream.read.reader import FileRead, ReadSchema
from deltastream.storage import open_store


def read_pairs(
    root: Path,
    reads: list[tuple[FileRead, ReadSchema]],
    on_missing: Any = None,
    concurrency: int = 2,
    seen: list[str] | None = None,
) -> list[tuple[str, pa.RecordBatch]]:
    """The (path, batch) pairs of ``reads`` under ``root``; ``seen`` gets each path as its
    batch arrives (what came before an error)."""
    got: list[tuple[str, pa.RecordBatch]] = []

    async def tasks() -> AsyncIterator[tuple[FileRead, ReadSchema]]:
        for r in reads:
            yield r

    async def main() -> None:
        async with open_store(str(root)) as store:
            pairs = read_file_batches(
                store, tasks(), concurrency=concurrency, on_missing=on_missing
            )
            async for task, batch in pairs:
                got.append((task.path, batch))
                if seen is not None:
                    seen.append(task.path)

    anyio.run(main)
    return got
