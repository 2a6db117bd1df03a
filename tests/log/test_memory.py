"""The pool checkpoints are decoded into: jemalloc unless the environment chose a pool."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest

from deltastream.log.memory import decode_pool


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    decode_pool.cache_clear()
    yield
    decode_pool.cache_clear()


def test_jemalloc_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:
        assert decode_pool().backend_name == pa.default_memory_pool().backend_name
    else:
        assert decode_pool().backend_name == "jemalloc"


def test_the_environment_s_pool_is_obeyed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "system")
    assert decode_pool().backend_name == pa.default_memory_pool().backend_name
