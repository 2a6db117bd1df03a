"""Process-wide settings for deltastream's own programs (the CLI, the daemon, and the
Python processes Spark runs the source in).

Libraries should not change global state on import, so nothing here runs unless a program
calls it. :func:`use_fast_allocator` switches pyarrow to jemalloc: on the streaming reads
deltastream does (many short-lived batches across threads) pyarrow's default mimalloc pool
keeps far more freed memory resident (measured: about 100 MiB more peak RSS and 15% more
time on the change-data benchmark). An explicit ``ARROW_DEFAULT_MEMORY_POOL`` always wins.

:func:`keep_pandas_out_of_pyarrow` spares a process pandas, which pyarrow would import
only to learn that no value is a pandas object (exactly: it is told of pandas once imported).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
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


def keep_pandas_out_of_pyarrow(*, alone: bool = False) -> None:
    """pyarrow stops importing pandas to ask whether Python values are pandas objects, until
    pandas is imported.

    pyarrow's conversions of Python values (``pa.array``, ``pa.scalar``, which parsing the
    log does throughout) first ask its pandas shim whether the values are pandas objects, and
    the shim imports pandas to answer: about 0.4 s and 35 MiB of a process, before its first
    row (the ``deltastream`` command; each of Spark's Python processes that plans a query).
    Until pandas is imported no value can be a pandas object, so the shim is given the
    answer "no pandas" once, and told of pandas the moment anything imports it: from then on
    pyarrow's pandas integration is as ever (conversions of pandas objects, ``to_pandas``).
    The answer is exact either way, so this may run in a process shared with other code (a
    Spark worker). Only the shim's question is answered: where pyarrow infers the type of
    Python values (no type given, as ``pyarrow.dataset`` does when imported) its C++ side
    still imports pandas for pandas' null sentinels, as it would. With ``alone`` (a process
    that runs deltastream's code alone: the command) the C++ side is answered "no pandas" too,
    for good: its conversions of Python lists then do not recognise pandas' ``NA`` and
    ``NaT`` in them, which no value of such a process is. Idempotent; nothing changes where
    pandas is already imported, or where pyarrow is not as this expects.

    It refuses ``import pandas`` for the instant the shim asks: a thread importing pandas in
    that instant would fail, so call it where none does (a program's start, a data source's
    entry points).
    """
    asks = {"shim", "inference"} if alone else {"shim"}
    if asks <= _answered or "pandas" in sys.modules:
        return
    shim = getattr(pa.lib, "_pandas_api", None)
    if shim is None or not hasattr(type(shim), "have_pandas"):
        _answered.update(asks)
        return  # another pyarrow: leave it as it is
    refuse = _RefusePandas()
    sys.meta_path.insert(0, refuse)
    try:
        if "shim" not in _answered:
            shim.have_pandas  # noqa: B018 (the shim asks once, and remembers the answer)
        if "inference" in asks - _answered:
            pa.array([0])  # C++ type inference asks once too, and remembers
    finally:
        sys.meta_path.remove(refuse)
    if "shim" not in _answered:
        sys.meta_path.insert(0, _TellPyarrowOfPandas())
    _answered.update(asks)


#: Which of pyarrow's questions this process has answered ("shim", "inference").
_answered: set[str] = set()


class _RefusePandas(importlib.abc.MetaPathFinder):
    """``import pandas`` fails while pyarrow checks for it."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "pandas":
            raise ModuleNotFoundError("pandas is not imported yet", name=fullname)
        return None


class _TellPyarrowOfPandas(importlib.abc.MetaPathFinder):
    """At ``import pandas``: pandas' own spec, whose loader tells pyarrow of pandas once
    pandas has run (pyarrow's shim then imports it again, from ``sys.modules``), and takes
    this finder away. A mere look for pandas (``importlib.util.find_spec``, as libraries
    probe whether it is installed) runs nothing, so it leaves the finder in place for the
    import that may follow."""

    def __init__(self) -> None:
        #: Set while this finder asks the others (the same thread would ask it again).
        self._asking = threading.local()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "pandas" or getattr(self._asking, "now", False):
            return None
        self._asking.now = True
        try:
            spec = importlib.util.find_spec(fullname)  # by the other finders
        finally:
            self._asking.now = False
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenTellPyarrow(spec.loader, self)
        return spec


class _ThenTellPyarrow(importlib.abc.Loader):
    """pandas' loader, telling pyarrow of pandas once pandas has run; the rest delegated."""

    def __init__(self, loader: importlib.abc.Loader, finder: _TellPyarrowOfPandas) -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        with contextlib.suppress(ValueError):  # taken away by another import of pandas
            sys.meta_path.remove(self._finder)
        with contextlib.suppress(Exception):  # pyarrow refuses this pandas: as it would
            pa.lib._pandas_api.compat  # noqa: B018 (pyarrow imports pandas again: now)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
