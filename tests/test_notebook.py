"""The synchronous API in a real Jupyter kernel (ipykernel, driven by nbclient), where every
cell runs inside the kernel's asyncio loop, and in any running event loop; what a notebook
shows for the public objects (short reprs, not the file list)."""

from __future__ import annotations

import inspect
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import nbformat
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from nbclient import NotebookClient

import deltastream as ds

#: The public functions that read a table synchronously: each works in a notebook.
SYNC_READERS = {"read_snapshot", "read_rows", "read_changes"}
#: The other public plain functions: they run no async code (or return a coroutine).
OTHER_FUNCTIONS = {"is_transient", "load_config", "open_store", "open_table", "parse_sink"}


@pytest.fixture
def table(tmp_path: Path) -> str:
    """Version 0: ids 0-4; 1: ids 5 and 6 appended; 2: id 0 deleted (change data on)."""
    uri = str(tmp_path / "events")
    ids = pa.table({"id": pa.array(range(5), pa.int64())})
    write_deltalake(uri, ids, configuration={"delta.enableChangeDataFeed": "true"})
    write_deltalake(uri, pa.table({"id": pa.array([5, 6], pa.int64())}), mode="append")
    DeltaTable(uri).delete("id = 0")
    return uri


def test_every_public_function_is_a_sync_reader_or_runs_no_async_code() -> None:
    """A new synchronous entry point must join the notebook test below."""
    functions = {
        name
        for name in ds.__all__
        if inspect.isfunction(getattr(ds, name))
        and not inspect.iscoroutinefunction(getattr(ds, name))
    }
    assert functions == SYNC_READERS | OTHER_FUNCTIONS


def cell_outputs(cell: Any) -> tuple[list[Any], str | None]:
    """The JSON lines a cell printed, and the text it displayed as its result."""
    errors = [o for o in cell.outputs if o.output_type == "error"]
    assert errors == [], f"{cell.source}\n{errors[0].ename}: {errors[0].evalue}"
    printed = "".join(o.text for o in cell.outputs if o.output_type == "stream")
    shown = [o.data["text/plain"] for o in cell.outputs if o.output_type == "execute_result"]
    return [json.loads(line) for line in printed.splitlines()], (shown[0] if shown else None)


def run_notebook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *sources: str) -> list[Any]:
    """Run cells in a fresh kernel of this interpreter; the executed cells."""
    # A kernelspec of its own, first on the search path: the kernel is this interpreter
    # (where deltastream is installed) whatever other "python3" kernels the machine has.
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    kernel = {"argv": argv, "display_name": "Python 3", "language": "python"}
    (spec / "kernel.json").write_text(json.dumps(kernel))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(textwrap.dedent(s)) for s in sources]
    client = NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=120,
        allow_errors=True,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    cells: list[Any] = notebook.cells
    return cells


def test_the_sync_api_works_in_a_jupyter_kernel(
    table: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup, snapshot, old, rows, changes, missing, opened, tailed = run_notebook(
        tmp_path,
        monkeypatch,
        f"""
        import json
        import deltastream as ds
        URI = {table!r}
        STATE = {str(tmp_path / "state")!r}
        """,
        """
        snap = ds.read_snapshot(URI)
        print(json.dumps([snap.version, snap.num_files]))
        snap
        """,
        """
        print(json.dumps(ds.read_snapshot(URI, version=0).num_files))
        """,
        """
        reader = ds.read_rows(URI, columns=["id"], where="id >= 2")
        ids = [i for batch in reader for i in batch.column("id").to_pylist()]  # lazily
        print(json.dumps(sorted(ids)))
        """,
        """
        got = ds.read_changes(URI, start_version=1).read_all()
        print(json.dumps(sorted(zip(got["_commit_version"].to_pylist(),
                                    got["_change_type"].to_pylist(), got["id"].to_pylist()))))
        """,
        """
        try:
            ds.read_snapshot(URI + "-missing")
        except ds.TableNotFoundError as e:
            print(json.dumps(type(e).__name__))
        """,
        """
        async with ds.open_table(URI) as table:
            print(json.dumps((await table.snapshot(version=1)).version))
        table
        """,
        """
        delivered = []
        def collect(delivery):
            delivered.extend(i for b in delivery.batches for i in b["id"].to_pylist())
        await ds.tail(URI, collect, state=STATE, mode="snapshot")
        print(json.dumps(sorted(delivered)))
        """,
    )
    assert cell_outputs(setup) == ([], None)
    printed, shown = cell_outputs(snapshot)
    assert printed == [[2, 2]]
    delta = DeltaTable(table)
    size = sum(pa.table(delta.get_add_actions(flatten=True))["size_bytes"].to_pylist())
    assert size < 1024
    assert shown == (
        f"Snapshot(table={table!r}, version=2, files=2, size={size} B, id={delta.metadata().id!r})"
    )
    assert cell_outputs(old) == ([1], None)
    assert cell_outputs(rows) == ([[2, 3, 4, 5, 6]], None)
    assert cell_outputs(changes) == ([[[1, "insert", 5], [1, "insert", 6], [2, "delete", 0]]], None)
    assert cell_outputs(missing) == (["TableNotFoundError"], None)
    assert cell_outputs(opened) == ([1], f"Table(uri={table!r})")
    assert cell_outputs(tailed) == ([[1, 2, 3, 4, 5, 6]], None)


@pytest.mark.anyio
async def test_the_sync_api_works_inside_any_running_event_loop(table: str) -> None:
    assert ds.read_snapshot(table).version == 2
    assert ds.read_snapshot(table, version=1).num_files == 2
    assert sorted(ds.read_rows(table).read_all()["id"].to_pylist()) == [1, 2, 3, 4, 5, 6]
    assert ds.read_changes(table, start_version=2).read_all()["id"].to_pylist() == [0]
    with pytest.raises(ds.TableNotFoundError):
        ds.read_snapshot(table + "-missing")
