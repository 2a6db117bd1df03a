"""Empty Arrow tables of a schema, made without pandas.

``pyarrow.Schema.empty_table()`` imports pandas (most of a second), which every process
reading a log would then pay, Spark's per-query Python processes among them; this builds
the same table (one empty chunk per column) from ``pa.nulls(0, type)`` (``pa.array([])``
imports pandas too).
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["empty_table"]


def empty_table(schema: pa.Schema) -> pa.Table:
    """A table of ``schema`` with no rows (one empty chunk per column, as
    ``schema.empty_table()`` makes)."""
    return pa.Table.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)
