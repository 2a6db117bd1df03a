"""Process-wide settings for deltastream's own programs (the CLI, the daemon, and the
Python processes Spark runs the source in).

Libraries should not change global state on import, so nothing here runs unless a program
calls it. :func:`use_fast_allocator` switches pyarrow to jemalloc: on the streaming reads
deltastream does (many short-lived batches across threads) pyarrow's default mimalloc pool
keeps far more freed memory resident (measured: about 100 MiB more peak RSS and 15% more
time on the change-data benchmark). An explicit ``ARROW_DEFAULT_MEMORY_POOL`` always wins.

:func:`keep_pandas_out_of_pyarrow` spares a process pandas, which pyarrow would import
only to learn that no value is a pandas object.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import pyarrow as pa

__all__ = ["keep_pandas_out_of_pyarrow", "use_fast_allocator"]


def use_fast_allocator() -> str:
    """Make jemalloc pyarrow's default memory pool, unless the environment chose one.

    Returns the name of the pool in use afterwards.
    """
    if "ARROW_DEFAULT_MEMORY_POOL" not in os.environ:
        with contextlib.suppress(NotImplementedError):  # a pyarrow build without jemalloc
            pa.set_memory_pool(pa.jemalloc_memory_pool())
    return str(pa.default_memory_pool().backend_name)


def keep_pandas_out_of_pyarrow() -> None:
    """For a process deltastream runs alone: pyarrow stops importing pandas to convert
    Python values.

    pyarrow's first conversion of Python values (``pa.array``, ``pa.scalar``, which parsing
    the log does throughout) imports pandas, only to ask whether the values are pandas
    objects and to learn pandas' null sentinels: about 0.4 s and 35 MiB of every process,
    before its first row (the ``deltastream`` command, and each Spark query's source runner).
    No value deltastream converts is a pandas object, so here pyarrow is given "no pandas"
    once, for the process. pandas stays importable: pyarrow is told of it when it is imported
    (``to_pandas`` and conversions of pandas objects then work as ever), but pyarrow's
    conversions of Python lists no longer recognise pandas' ``NA`` and ``NaT`` in them, which
    is why this is only for processes that run deltastream's code alone. Idempotent; nothing
    changes where pandas is already imported, or where pyarrow is not as this expects.

    It briefly refuses ``import pandas`` while pyarrow asks: call it where no other thread
    may be importing pandas (a program's start).
    """
    global _kept_out
    if _kept_out or "pandas" in sys.modules:
        return
    _kept_out = True
    shim = getattr(pa.lib, "_pandas_api", None)
    if shim is None or not hasattr(type(shim), "have_pandas"):
        return  # another pyarrow: leave it as it is
    refuse = _RefusePandas()
    sys.meta_path.insert(0, refuse)
    try:
        # pyarrow asks once in Python (its pandas shim) and once in C++ (type inference's
        # pandas sentinels), and each remembers the answer.
        shim.have_pandas  # noqa: B018
        pa.array([0])
    finally:
        sys.meta_path.remove(refuse)
    sys.meta_path.insert(0, _TellPyarrowOfPandas())


_kept_out = False


class _RefusePandas(importlib.abc.MetaPathFinder):
    """``import pandas`` fails while pyarrow checks for it."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "pandas":
            raise ModuleNotFoundError("pandas is not imported yet", name=fullname)
        return None


class _TellPyarrowOfPandas(importlib.abc.MetaPathFinder):
    """Once, at ``import pandas``: pandas' own spec, whose loader tells pyarrow of pandas
    when pandas has run (pyarrow's shim then imports it again, from ``sys.modules``)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "pandas":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)  # by the finders after this one
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenTellPyarrow(spec.loader)
        return spec


class _ThenTellPyarrow(importlib.abc.Loader):
    """pandas' loader, telling pyarrow of pandas once pandas has run; the rest delegated."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        with contextlib.suppress(Exception):  # pyarrow refuses this pandas: as it would
            pa.lib._pandas_api.compat  # noqa: B018 (pyarrow imports pandas again: now)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
