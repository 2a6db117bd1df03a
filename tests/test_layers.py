"""The package's layers import in one direction only:
errors <- storage <- log <- snapshot <- schema <- read <- changes <- {spark, daemon, cli}."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "deltastream"
LAYERS = {
    "errors": 0,
    "storage": 1,
    "log": 2,
    "snapshot": 3,
    "schema": 4,
    "read": 5,
    "changes": 6,
}
TOP = 7  # spark, daemon, cli and the package's own __init__/__main__
#: Network libraries: the object stores use them, and so does the daemon for its own endpoints
#: (the HTTP sink and the health/metrics server); nothing else may.
STORAGE_ONLY_IMPORTS = {
    "aiobotocore",
    "botocore",
    "aiohttp",
    "watchfiles",
    "inotify_simple",
    "azure",
    "gcloud",
    "psycopg",
}
NETWORK_PACKAGES = ("deltastream.storage", "deltastream.daemon")
DAEMON_FORBIDDEN = {"aiobotocore", "botocore", "watchfiles", "inotify_simple", "azure", "gcloud"}


def layer_of(module: str) -> int:
    parts = module.split(".")
    if parts[0] != "deltastream" or len(parts) == 1:
        return TOP
    return LAYERS.get(parts[1], TOP)


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text())
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.lineno))
    return found


def test_imports_point_down_the_layers() -> None:
    violations = []
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 20
    for path in files:
        me = module_name(path)
        for target, line in imports(path):
            if target.startswith("deltastream") and layer_of(target) > layer_of(me):
                violations.append(f"{path.relative_to(ROOT)}:{line}: {me} imports {target}")
    assert violations == []


def test_network_libraries_stay_in_storage() -> None:
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        me = module_name(path)
        for target, line in imports(path):
            top = target.split(".")[0]
            allowed = me.startswith(NETWORK_PACKAGES) and not (
                me.startswith("deltastream.daemon") and top in DAEMON_FORBIDDEN
            )
            if top in STORAGE_ONLY_IMPORTS and not allowed:
                violations.append(f"{path.relative_to(ROOT)}:{line}: {me} imports {target}")
    assert violations == []


def test_every_module_says_what_it_owns() -> None:
    missing = [
        str(p.relative_to(ROOT))
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.name != "__main__.py" and ast.get_docstring(ast.parse(p.read_text())) is None
    ]
    assert missing == []


def test_pyspark_stays_in_the_spark_package() -> None:
    """pyspark is an optional extra: only deltastream.spark imports it, and nothing else in
    the package imports deltastream.spark (``import deltastream`` works without pyspark)."""
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        me = module_name(path)
        if me.startswith("deltastream.spark"):
            continue
        for target, line in imports(path):
            if target.split(".")[0] == "pyspark" or target.startswith("deltastream.spark"):
                violations.append(f"{path.relative_to(ROOT)}:{line}: {me} imports {target}")
    assert violations == []


def test_object_store_clients_load_only_when_a_store_opens() -> None:
    """``import deltastream``, the stores' options and the Spark source's option names load
    no client library (aiobotocore, the Azure SDK, gcloud-aio): each is heavy, and Azure's
    and GCS's are optional extras."""
    import subprocess
    import sys

    code = """
import sys
import deltastream
from deltastream.storage import storage_option_names
from deltastream.storage.azure import AzureOptions
from deltastream.storage.gcs import GcsOptions
from deltastream.storage.s3 import S3Options
assert "azure_storage_account_name" in storage_option_names()
loaded = sorted(m for m in ("aiobotocore", "azure", "gcloud") if m in sys.modules)
assert loaded == [], loaded
deltastream.open_store("gs://b/t", {"endpoint_url": "http://127.0.0.1:1"})
deltastream.open_store("az://c/t", {"azure_storage_use_emulator": "true"})
assert "gcloud.aio.auth" not in sys.modules  # loaded only to sign requests
assert "azure.core" in sys.modules and "aiobotocore" not in sys.modules
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_store_without_its_extra_is_one_clear_error() -> None:
    import subprocess
    import sys

    code = """
import sys
sys.modules["gcloud"] = None  # as if the gcs extra were not installed
sys.modules["azure.identity"] = None
import deltastream
for uri, extra in (("gs://b/t", "gcs"), ("az://c/t", "azure")):
    try:
        deltastream.open_store(uri)
    except deltastream.InvalidArgumentError as e:
        assert str(e).startswith(f"{uri}: this store needs the {extra} extra: "
                                 f"pip install 'deltastream[{extra}]'"), e
    else:
        raise AssertionError(uri)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
