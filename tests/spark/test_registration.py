"""The ``deltastream`` format in sessions that never called ``register``: README's install
lines, each run as written in a fresh virtualenv, leave Spark able to find the installed
``pyspark_deltastream`` package's ``DefaultSource`` itself: in a classic session after each
line, and through Spark Connect after the copied install (``CHECK``).

Spark (≥ 4.0) looks for Python data sources once per JVM, in a Python worker that lists
``pkgutil.iter_modules()``: the packages of ``sys.path``'s directories. An editable install
is found only when it is a ``.pth`` entry naming the checkout, not an import finder
(pyproject.toml's ``package-dir``). The lines are read from README's "Installing" section
(the Spark section's line must be one of them), run by ``bash`` in the checkout copied to a
temporary directory, with the virtualenv's ``bin`` first on ``PATH`` as its ``activate``
does. The editable line runs first; the copied install then replaces it in the same
virtualenv (pip installs only deltastream: the dependencies are there), so pyspark is
installed once. pyspark and the other dependencies come from pip's configured index
(normally from pip's cache). Each check runs in a directory of its own, without
``PYTHONPATH`` or ``PYSPARK_PYTHON`` (Spark's workers run ``python3`` from ``PATH``: the
virtualenv's): neither the working directory nor this environment can lend the package.

The virtualenv is kept between runs (``readme-install`` in tests/ci_cache.py's directory),
as the Spark smoke suites' are: pyspark and its kin are about 900 MB, and installing them
took most of this test's four minutes. A run whose stamp (this Python, pyproject.toml's
dependencies) differs from the kept one's starts from a new, empty virtualenv and installs
everything from the index, as a new user would; otherwise deltastream is uninstalled first,
so that README's lines install it again, as written, beside the dependencies they
installed before.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ci_cache import locked, stamp
from conftest import CORPORA

ROOT = Path(__file__).resolve().parents[2]
TABLE = CORPORA / "delta-kernel-rs/data/table-with-dv-small"
ROWS = 8  # 10 rows, 2 deleted by a deletion vector
#: What an install from a checkout needs (the rest is tests, deployment, caches).
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "deltastream", "pyspark_deltastream")
#: Variables of this test environment that would lend the package or choose Spark's mode.
UNSET = (
    "PYTHONPATH",
    "PYTHONHOME",
    "VIRTUAL_ENV",
    "PYSPARK_PYTHON",
    "PYSPARK_DRIVER_PYTHON",
    "SPARK_HOME",
    "SPARK_REMOTE",
    "SPARK_CONNECT_MODE_ENABLED",
    "SPARK_LOCAL_REMOTE",
    "SPARK_API_MODE",
)

#: A new classic session reads the table by the format's name; then, with a second argument,
#: a session through a local Spark Connect server (``remote("local[1]")``: a server in this
#: process's JVM, its Python workers this virtualenv's) does. Spark looks data sources up
#: once per JVM, so the second read shows that the Connect client resolves the format with
#: what the server found. The copied install is checked through Connect as well; the
#: editable one only in a classic session, since tests/spark/test_connect.py's Connect server
#: (of its own, in the tests' environment: an editable install) finds the format already,
#: and a Connect server costs a third of a check's CPU.
CHECK = """
import json, pkgutil, sys
from pyspark.sql import SparkSession

table = sys.argv[1]
result = {"listed": "pyspark_deltastream" in {m.name for m in pkgutil.iter_modules()}}
builder = SparkSession.builder.config("spark.ui.showConsoleProgress", "false")
spark = builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
result["classic"] = spark.read.format("deltastream").load(table).count()
spark.stop()
if sys.argv[2:] == ["connect"]:
    spark = SparkSession.builder.remote("local[1]").getOrCreate()
    result["session"] = type(spark).__module__
    result["connect"] = spark.read.format("deltastream").load(table).count()
    spark.stop()
import deltastream
result["deltastream"] = deltastream.__file__
print(json.dumps(result))
"""


def code_block(section: str) -> list[str]:
    """The ``pip install`` commands of README's first ``sh`` block under ``section``,
    comments cut."""
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n{section}\n")
    block = re.search(r"```sh\n(.*?)```", text[start:], re.S)
    assert block, f"README: no sh block under {section}"
    lines = (line.split(" #")[0].strip() for line in block.group(1).splitlines())
    return [line for line in lines if line.startswith("pip install")]


def checkout_lines() -> list[str]:
    """README's install lines from a checkout, editable first."""
    lines = [line for line in code_block("### Installing") if "'.[" in line]
    assert lines == ["pip install -e '.[spark]'", "pip install '.[spark]'"], (
        f"README's install lines changed ({lines}): update this test to run them as written"
    )
    assert set(code_block("## Spark")) <= set(lines), "README's Spark line is not tested here"
    return lines


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{argv}:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done.stdout


#: ``remote("local[1]")`` starts its Connect server on Spark's default port, 15002, the one
#: its client then dials: a machine-wide resource, so a check waits for any other test run
#: on this machine (another worker, another checkout's suite) to be done with it.
CONNECT_PORT_LOCK = Path(tempfile.gettempdir()) / "deltastream-tests-spark-connect-15002.lock"


def check(cwd: Path, env: dict[str, str], *, connect: bool) -> dict[str, object]:
    argv = ["python", "-c", CHECK, str(TABLE), *(["connect"] if connect else [])]
    with contextlib.ExitStack() as stack:
        if connect:
            lock = stack.enter_context(open(CONNECT_PORT_LOCK, "a"))
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        out = run(argv, cwd, env)
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return result


def test_readme_install_lines_let_spark_find_the_format(tmp_path: Path) -> None:
    lines = checkout_lines()
    checkout, elsewhere = tmp_path / "checkout", tmp_path / "run"
    checkout.mkdir()
    elsewhere.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
            shutil.copytree(ROOT / name, checkout / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, checkout / name)
    with locked("readme-install") as venv:
        ready = venv / ".deltastream-stamp"
        kept = ready.is_file() and ready.read_text() == stamp("readme-install")
        ready.unlink(missing_ok=True)  # written again once the lines have passed
        env = {k: v for k, v in os.environ.items() if k not in UNSET}
        env |= {"VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}"}
        if kept:
            # The last run's deltastream (editable, from a checkout now gone, or copied);
            # then it must not import (run elsewhere: a checkout's directory would lend it).
            run(["python", "-m", "pip", "uninstall", "-q", "-y", "deltastream"], elsewhere, env)
            probe = ["python", "-c", "import deltastream"]
            gone = subprocess.run(probe, cwd=elsewhere, env=env, capture_output=True)
            kept = gone.returncode != 0
        if not kept:
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        run_lines(lines, checkout, venv, elsewhere, env)
        ready.write_text(stamp("readme-install"))


def run_lines(
    lines: list[str], checkout: Path, venv: Path, elsewhere: Path, env: dict[str, str]
) -> None:
    """Each install line in ``checkout`` with ``venv`` activated (``env``), then the checks."""
    for line in lines:
        run(["bash", "-c", line], checkout, env)
        editable = " -e " in f" {line} "
        home = checkout if editable else venv
        result = check(elsewhere, env, connect=not editable)
        assert result["classic"] == ROWS, (line, result)
        if not editable:
            assert result["connect"] == ROWS, (line, result)
            assert result["session"] == "pyspark.sql.connect.session", (line, result)
        assert result["listed"], (line, result)
        assert str(result["deltastream"]).startswith(str(home)), (line, result)
