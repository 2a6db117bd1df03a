"""Every kind of hostile or invalid log (``tests/hostile_tables.py``) gets the same clear
error from every consumer (issue 11, "Done when"): the matching exception in Python, one
line and exit status 2 from the CLI (the daemon: ``tests/daemon/test_hostile_streams.py``).
Never rows of a hostile version, and never rows from outside the table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostile_tables import HOSTILE, Hostile

import deltastream as ds
from deltastream.cli import run


def expect(case: Hostile, error: BaseException) -> None:
    assert isinstance(error, case.error), f"{type(error).__name__}: {error}"
    assert case.fragment in str(error) and case.names in str(error), str(error)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_python_readers_raise_the_named_error(tmp_path: Path, name: str) -> None:
    case = HOSTILE[name](tmp_path)
    readers = [lambda: ds.read_rows(case.uri).read_all()]
    if case.has_change_feed:
        readers.append(lambda: ds.read_changes(case.uri, start_version=0).read_all())
    for read in readers:
        with pytest.raises(ds.DeltaStreamError) as info:
            read()
        expect(case, info.value)
        assert not ds.is_transient(info.value)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_the_cli_prints_one_line_and_exits_2(tmp_path: Path, capsys: Any, name: str) -> None:
    case = HOSTILE[name](tmp_path)
    commands = [["read", case.uri, "-o", "-"]]
    if case.has_change_feed:
        commands.append(["changes", case.uri, "--from", "0", "-o", "-"])
    for command in commands:
        capsys.readouterr()
        assert run(command) == 2
        out, err = capsys.readouterr()
        # Rows stream out as they are read (here those of version 0, ids 0..2); none of a
        # hostile version (ids 10, 11) or from outside the table (100, 101) is among them.
        assert all(json.loads(line)["id"] < 10 for line in out.splitlines()), out
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("deltastream: error: "), err
        assert case.fragment in lines[0] and case.names in lines[0]
