"""Logs with stray or impossible files (issue 11): each gives one clear error, quickly and
in bounded memory, from the Python API and the CLI (one line, exit status 2)."""

from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

import deltastream as ds
from deltastream.cli import run


def table_with(tmp_path: Path, stray: str) -> str:
    uri = str(tmp_path / "t")
    for i in range(3):
        write_deltalake(uri, pa.table({"id": [i]}), mode="append")
    (tmp_path / "t" / "_delta_log" / stray).write_text("{}\n")
    return uri


@pytest.mark.parametrize(
    ("stray", "error", "message"),
    [
        ("00000000000100000000.json", ds.MissingVersionsError, r"3-99999999 \(99,999,997"),
        ("99999999999999999999.json", ds.CorruptFileError, "beyond the largest"),
    ],
)
def test_a_stray_commit_name_is_one_clear_error_at_once(
    tmp_path: Path, capsys: Any, stray: str, error: type[Exception], message: str
) -> None:
    uri = table_with(tmp_path, stray)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    with pytest.raises(error, match=message):
        ds.read_snapshot(uri)
    assert time.monotonic() - started < 5
    # Peak memory grows by well under 100 MB (it once built a list of every missing version).
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 * 1024
    assert run(["snapshot", uri]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("deltastream: error: ")
    assert stray in lines[0] or "missing commit version" in lines[0]
