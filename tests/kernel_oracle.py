"""delta-kernel-rs as an oracle, through its Python wrapper (the PyPI package
``delta-kernel-rust-sharing-wrapper``): a table's change data feed and its latest snapshot,
as Arrow tables."""

from __future__ import annotations

from pathlib import Path

import delta_kernel_rust_sharing_wrapper as kernel
import pyarrow as pa

__all__ = ["kernel_changes", "kernel_snapshot"]


def _uri(path: str | Path) -> str:
    return Path(path).resolve().as_uri() + "/"


def kernel_changes(path: str | Path, start: int, end: int | None) -> pa.Table:
    """The change rows of versions ``start..end`` (``None``: the latest)."""
    uri = _uri(path)
    engine = kernel.PythonInterface(uri)
    table = kernel.Table(uri)
    scan = kernel.TableChangesScanBuilder(table, engine, start, end).build()
    result = scan.execute(engine)
    return result.read_all() if hasattr(result, "read_all") else pa.table(result)


def kernel_snapshot(path: str | Path) -> pa.Table:
    """The rows of the table's latest version."""
    uri = _uri(path)
    engine = kernel.PythonInterface(uri)
    snapshot = kernel.Table(uri).snapshot(engine)
    return kernel.ScanBuilder(snapshot).build().execute(engine).read_all()
