"""The package as users get it: ``python -m build`` makes an sdist and a wheel that install
into a clean virtualenv and run ``deltastream --version``; the wheel carries ``py.typed``
and the licence.

The build runs without isolation (``--no-isolation``: the setuptools and wheel of the
``dev`` extra), from a copy of the source files, so that it needs no network and leaves
nothing in the checkout. The virtualenv is a clean one (no ``--system-site-packages``):
the wheel is installed with its dependencies, as a user would install it, from pip's
configured index (normally from pip's cache, filled when the ``dev`` extra was installed:
about 15 s). That checks the declared dependencies too, which a ``--no-deps`` install into
a virtualenv seeing this environment's packages would not. The sdist is then installed
over it (``--no-deps``: its dependencies are the wheel's, already there), built by pip from
the sdist alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
#: What the build needs from the checkout (the rest is tests, deployment, caches).
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "deltastream", "pyspark_deltastream")


def run(*argv: str | Path, cwd: Path) -> str:
    # Outside the checkout and without PYTHONPATH, so that only what was installed is found.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{argv}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_sdist_and_wheel_install_into_a_clean_virtualenv(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy2(ROOT / name, source / name)
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, source, cwd=tmp_path)
    (wheel,) = dist.glob("deltastream-*.whl")
    (sdist,) = dist.glob("deltastream-*.tar.gz")
    assert wheel.name == f"deltastream-{VERSION}-py3-none-any.whl"
    assert sdist.name == f"deltastream-{VERSION}.tar.gz"

    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = z.read(f"deltastream-{VERSION}.dist-info/METADATA").decode()
        licence = z.read(f"deltastream-{VERSION}.dist-info/licenses/LICENSE").decode()
    assert "deltastream/py.typed" in names
    # Spark's automatic registration of the format (tests/spark/test_registration.py)
    assert "pyspark_deltastream/__init__.py" in names
    assert licence == (ROOT / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in licence
    assert "License-Expression: Apache-2.0" in metadata.splitlines()

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python, script = venv / "bin" / "python", venv / "bin" / "deltastream"
    # --no-compile: byte-compiling the dependencies (pyarrow's, deltalake's...) checks nothing.
    pip = (python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile")
    # A clean virtualenv: its own site-packages only, none of this environment's packages.
    code = "import sys; print('\\n'.join(p for p in sys.path if 'site-packages' in p))"
    site_packages = run(python, "-c", code, cwd=tmp_path).split()
    assert site_packages and all(p.startswith(str(venv)) for p in site_packages)

    run(*pip, wheel, cwd=tmp_path)
    assert run(script, "--version", cwd=tmp_path) == f"deltastream {VERSION}\n"
    where = run(python, "-c", "import deltastream; print(deltastream.__file__)", cwd=tmp_path)
    assert where.startswith(str(venv))  # the wheel's code, not the checkout's

    run(*pip, "--force-reinstall", "--no-deps", sdist, cwd=tmp_path)
    assert run(script, "--version", cwd=tmp_path) == f"deltastream {VERSION}\n"
    assert run(python, "-m", "deltastream", "--version", cwd=tmp_path) == (
        f"deltastream {VERSION}\n"
    )
    installed = run(python, "-m", "pip", "show", "--files", "deltastream", cwd=tmp_path)
    assert "deltastream/py.typed" in installed
