"""Running the documentation's examples (docs/examples/), as the pages show them.

Every example is a file that a page includes whole (``--8<--``, pymdownx.snippets), so what
a reader sees is what runs here. The examples of one directory form a scenario: they run in
sorted order in one fresh directory holding ``events``, a small Delta table with the change
data feed on (:func:`make_events_table`), with ``deltastream`` and ``python`` on ``PATH``
running this checkout. Python files run in-process (as ``__main__``), shell files with
``bash -eu``, TOML files are loaded as ``deltastream serve`` configurations.
The Spark examples (docs/examples/spark/) run in tests/spark/test_docs_examples.py, with
the session as ``spark``, as in a pyspark shell or notebook.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"
#: Scenario directories whose examples need more than a local directory, by what they need.
NEEDS_S3 = {"object-stores"}
#: Run with the Spark session, by tests/spark/test_docs_examples.py.
SPARK = "spark"
SUFFIXES = (".py", ".sh", ".toml")


def scenarios() -> list[str]:
    """The example directories tests/test_docs.py runs (all but Spark's)."""
    return sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir() and p.name != SPARK)


@contextlib.contextmanager
def _inside(directory: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(before)


def example_files(scenario: str) -> list[Path]:
    return sorted(p for p in (EXAMPLES / scenario).iterdir() if p.suffix in SUFFIXES)


#: The examples' table, as the pages show how it was made.
MAKE_EVENTS = EXAMPLES / "make_events.py"
#: Environment variables the examples' configurations read (``${NAME}``).
EXAMPLE_ENV = {"INGEST_TOKEN": "example-token", "ORDERS_DB_PASSWORD": "example-password"}


def make_events_table(directory: Path) -> Path:
    """``directory/events`` (docs/examples/make_events.py): version 0 inserts ids 0-4,
    version 1 updates id 1, version 2 deletes id 4, version 3 appends ids 5 and 6, with the
    change data feed on."""
    with _inside(directory):
        runpy.run_path(str(MAKE_EVENTS), run_name="__main__")
    return directory / "events"


def prepare(directory: Path, scenario: str) -> dict[str, str]:
    """Lay out a scenario's directory (the ``events`` table, the scenario's TOML files, which
    its shell examples use by name, and ``.bin/`` with ``deltastream`` and ``python`` of this
    checkout); the environment its shell examples run with."""
    make_events_table(directory)
    for config in (EXAMPLES / scenario).glob("*.toml"):
        shutil.copyfile(config, directory / config.name)
    bin_dir = directory / ".bin"
    bin_dir.mkdir()
    for name, command in (("deltastream", "-m deltastream"), ("python", "")):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}" {command} "$@"\n')
        script.chmod(0o755)
    env = {**os.environ, **EXAMPLE_ENV}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_example(
    path: Path,
    directory: Path,
    env: Mapping[str, str],
    init_globals: dict[str, Any] | None = None,
) -> str:
    """Run one example in ``directory``; what it printed (shell examples), for messages."""
    if path.suffix == ".py":
        # The scenario's own variables (not PATH: in-process, this interpreter runs it)
        own = {
            k: v
            for k, v in env.items()
            if os.environ.get(k) != v and k not in ("PATH", "PYTHONPATH")
        }
        with _inside(directory), _environment(own):
            runpy.run_path(str(path), init_globals=init_globals, run_name="__main__")
        return ""
    if path.suffix == ".toml":
        from deltastream import load_config

        with _inside(directory), _environment(EXAMPLE_ENV):
            load_config(str(path))
        return ""
    # Output goes to files, not pipes: a background command the script started keeps a
    # pipe open after the script has exited (or failed), and reading it would wait for that.
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            ["bash", "-eu", str(path)],
            cwd=directory,
            env=dict(env),
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # its background commands too are ended below
        )
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pass
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    output = f"--- stdout\n{stdout}\n--- stderr\n{stderr}"
    assert proc.returncode == 0, f"{path.relative_to(ROOT)} exited {proc.returncode}\n{output}"
    return output
