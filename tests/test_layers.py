"""The package's modules import in one direction only, and never in a circle.

Its layers, bottom to top (:data:`LAYERS`; every module of the package belongs to one through
its top-level module or subpackage, and a module the table does not name fails the test)::

    errors, _version, _lazy, runtime, sizes <- storage <- log <- snapshot <- schema <- read
        <- {changes, output} <- {daemon, spark} <- demo <- {cli, deltastream} <- __main__

A module imports only from its own top-level module or subpackage and from lower layers;
the names sharing a layer are independent of each other (the daemon and the Spark source
never import each other, nor do the CLI and the package root). Nothing inside the package
imports the bare package ``deltastream`` (its root imports everything: ``__version__`` comes
from :mod:`deltastream._version`). The top-level ``pyspark_deltastream`` package (Spark's
automatic registration) imports ``deltastream.spark`` and nothing else of deltastream.

Within the daemon its parts are layered the same way (:data:`DAEMON_LAYERS`)::

    {delivery, crashpoints} <- {sinks, observability} <- {stream, replicas} <- service <- api

Every import statement counts, wherever it is: relative ones (resolved), those inside
functions (deferred to spare an optional extra or a heavy library, but a dependency all
the same), and those under ``if TYPE_CHECKING:``. The last count for the layers because a
type in a signature is a dependency on the module that defines it (mypy, the docs and the
reader follow it); they also count for cycles, as do deferred imports: neither can fail an
import half-way, but each still ties the two modules together both ways (the lower one must
know the upper one's shape), which a ``Protocol`` or a callable in the lower one states
without the loop. Leaving them out would have hidden both circles this test was written
to break: ``daemon.server`` named ``Service`` under ``TYPE_CHECKING`` while ``Service.run``
imported the server inside a function, and ``storage.s3.feed`` named ``S3Store`` under
``TYPE_CHECKING`` while the store imported the feed.

Importing ``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py`` first; that is not counted
as an import of those packages (a package's ``__init__`` may defer imports of its own
submodules, as ``deltastream.storage`` does for the object stores' clients).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "deltastream"
SPARK_REGISTRATION = ROOT / "pyspark_deltastream"

#: The layers, bottom to top. Each name is the package root (``deltastream``), one of its
#: top-level modules, or one of its subpackages (with every module under it).
LAYERS: list[tuple[str, ...]] = [
    # Import nothing of the package (runtime: process settings for deltastream's programs;
    # sizes: the one rule for sizes in bytes users write, for the daemon and the Spark source).
    (
        "deltastream.errors",
        "deltastream._version",
        "deltastream._lazy",
        "deltastream.runtime",
        "deltastream.sizes",
    ),
    ("deltastream.storage",),
    ("deltastream.log",),
    ("deltastream.snapshot",),
    ("deltastream.schema",),  # below read: a read needs the table's schema, never the reverse
    ("deltastream.read",),
    # output: rows as JSON lines and parquet (Variant included), for the sinks and the CLI.
    ("deltastream.changes", "deltastream.output"),
    ("deltastream.daemon", "deltastream.spark"),
    ("deltastream.demo",),  # the CLI's demo command, on the daemon's Service
    ("deltastream.cli", "deltastream"),
    ("deltastream.__main__",),
]
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}

#: The daemon's parts, bottom to top, in the same way: each name is a module or subpackage of
#: ``deltastream.daemon``. Streams use sinks only through the seam in ``delivery`` (and
#: ``crashpoints``, which sinks call too), so a sink never knows the stream machinery; the
#: service runs streams; ``api`` (``deltastream.tail``) runs a service.
DAEMON_LAYERS: list[tuple[str, ...]] = [
    ("deltastream.daemon.delivery", "deltastream.daemon.crashpoints"),
    ("deltastream.daemon.sinks", "deltastream.daemon.observability"),
    ("deltastream.daemon.stream", "deltastream.daemon.replicas"),
    ("deltastream.daemon.service",),
    ("deltastream.daemon.api", "deltastream.daemon"),
]
DAEMON_LAYER_OF = {name: i for i, names in enumerate(DAEMON_LAYERS) for name in names}

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


@dataclass(frozen=True)
class Import:
    """One module an import statement imports (``from m import a, b`` may import several)."""

    importer: str
    target: str  # the module imported, relative imports resolved
    path: Path
    line: int
    where: str  # "module", "function" or "TYPE_CHECKING"

    def __str__(self) -> str:
        at = "" if self.where == "module" else f" ({self.where})"
        where = f"{self.path.relative_to(ROOT)}:{self.line}"
        return f"{where}: {self.importer} imports {self.target}{at}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of the package and of the Spark registration package, by name."""
    files = [*PACKAGE.rglob("*.py"), *SPARK_REGISTRATION.rglob("*.py")]
    return {module_name(p): p for p in sorted(files)}


def package_modules() -> dict[str, Path]:
    found = {m: p for m, p in modules().items() if m.split(".")[0] == "deltastream"}
    assert len(found) > 20
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement of a module, anywhere in it, and where it is."""

    def visit(node: ast.AST, where: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, where
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            where = "function"
        if isinstance(node, ast.If) and _is_type_checking(node.test) and where == "module":
            for child in node.body:
                yield from visit(child, "TYPE_CHECKING")
            for child in node.orelse:
                yield from visit(child, where)
            return
        for child in ast.iter_child_nodes(node):
            yield from visit(child, where)

    yield from visit(tree, "module")


def _resolve_from(importer: str, path: Path, node: ast.ImportFrom) -> str:
    """The module ``from <...> import`` names, relative imports resolved."""
    if node.level == 0:
        assert node.module is not None
        return node.module
    package = importer.split(".") if path.name == "__init__.py" else importer.split(".")[:-1]
    if node.level - 1 >= len(package):
        where = f"{path.relative_to(ROOT)}:{node.lineno}"
        raise AssertionError(f"{where}: relative import beyond the top of the package")
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


@cache
def imports_of(path: Path) -> tuple[Import, ...]:
    return parse_imports(path, path.read_text())


def parse_imports(path: Path, source: str) -> tuple[Import, ...]:
    """The modules the file at ``path`` imports: ``from m import n`` imports the module
    ``m.n`` when there is one (a submodule), else ``m``."""
    me = module_name(path)
    found: list[Import] = []
    for node, where in _import_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = _resolve_from(me, path, node)
            targets = []
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                target = sub if sub in modules() else base
                if target not in targets:
                    targets.append(target)
        found += [Import(me, t, path, node.lineno, where) for t in targets]
    return tuple(found)


def all_imports() -> list[Import]:
    return [i for path in package_modules().values() for i in imports_of(path)]


def inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layer_key(module: str) -> str:
    """The name of :data:`LAYERS` a module of the package is listed under: the package root,
    or its top-level module or subpackage."""
    return ".".join(module.split(".")[:2])


def test_every_module_is_on_a_named_layer() -> None:
    unlisted = sorted(
        f"{path.relative_to(ROOT)}: {m} is on no layer: add {layer_key(m)} to LAYERS"
        for m, path in package_modules().items()
        if layer_key(m) not in LAYER_OF
    )
    assert not unlisted, "\n".join(unlisted)
    named_but_gone = sorted(set(LAYER_OF) - {layer_key(m) for m in package_modules()})
    assert named_but_gone == []


def test_imports_point_down_the_layers() -> None:
    violations = []
    for imp in all_imports():
        if not inside(imp.target, "deltastream") or imp.target == "deltastream":
            continue  # third-party; the bare package: see the next test
        mine, theirs = layer_key(imp.importer), layer_key(imp.target)
        if mine == theirs:
            continue
        if theirs not in LAYER_OF:
            violations.append(f"{imp}: {theirs} is on no layer")
        elif LAYER_OF[theirs] > LAYER_OF[mine]:
            violations.append(f"{imp}: upward, from layer {mine} to layer {theirs}")
        elif LAYER_OF[theirs] == LAYER_OF[mine]:
            violations.append(f"{imp}: {mine} and {theirs} share a layer and are independent")
    assert not violations, "\n".join(violations)


def daemon_key(module: str) -> str:
    """The name of :data:`DAEMON_LAYERS` a module of the daemon is listed under."""
    return ".".join(module.split(".")[:3])


def test_every_daemon_module_is_on_a_named_part() -> None:
    daemon = {m for m in package_modules() if inside(m, "deltastream.daemon")}
    unlisted = sorted(m for m in daemon if daemon_key(m) not in DAEMON_LAYER_OF)
    assert unlisted == [], f"add to DAEMON_LAYERS: {unlisted}"
    assert sorted(set(DAEMON_LAYER_OF) - {daemon_key(m) for m in daemon}) == []


def test_the_daemons_parts_import_down() -> None:
    """Sinks never import the stream machinery or the service, observability imports
    neither them nor the sinks, streams never import the service (see
    :data:`DAEMON_LAYERS`)."""
    violations = []
    for imp in all_imports():
        if not (
            inside(imp.importer, "deltastream.daemon") and inside(imp.target, "deltastream.daemon")
        ):
            continue
        mine, theirs = daemon_key(imp.importer), daemon_key(imp.target)
        if mine == theirs or theirs not in DAEMON_LAYER_OF or mine not in DAEMON_LAYER_OF:
            continue  # unlisted parts: the test above
        if DAEMON_LAYER_OF[theirs] > DAEMON_LAYER_OF[mine]:
            violations.append(f"{imp}: upward, from {mine} to {theirs}")
        elif DAEMON_LAYER_OF[theirs] == DAEMON_LAYER_OF[mine]:
            violations.append(f"{imp}: {mine} and {theirs} share a part and are independent")
    assert not violations, "\n".join(violations)


def test_nothing_inside_imports_the_package_root() -> None:
    """The root imports the whole public API, so a module importing it (for
    ``__version__``, say) would import everything above itself, in a circle."""
    violations = [str(imp) for imp in all_imports() if imp.target == "deltastream"]
    assert not violations, "\n".join(violations)


def test_the_daemon_and_the_spark_source_are_independent() -> None:
    violations = [
        str(imp)
        for imp in all_imports()
        if (inside(imp.importer, "deltastream.daemon") and inside(imp.target, "deltastream.spark"))
        or (inside(imp.importer, "deltastream.spark") and inside(imp.target, "deltastream.daemon"))
    ]
    assert not violations, "\n".join(violations)


def test_spark_registration_imports_only_the_spark_source() -> None:
    """``pyspark_deltastream`` (what Spark registers on its own) is ``deltastream.spark``'s
    data source under the name Spark looks for, nothing more."""
    violations = [
        str(imp)
        for path in sorted(SPARK_REGISTRATION.rglob("*.py"))
        for imp in imports_of(path)
        if inside(imp.target, "deltastream") and imp.target != "deltastream.spark"
    ]
    assert not violations, "\n".join(violations)
    registration = imports_of(SPARK_REGISTRATION / "__init__.py")
    assert any(i.target == "deltastream.spark" for i in registration)


def _cycle(start: str, component: set[str], edges: dict[str, dict[str, Import]]) -> list[Import]:
    """The shortest circle from ``start`` back to itself within its strongly connected
    component."""
    paths: dict[str, list[Import]] = {start: []}
    queue = [start]
    while queue:
        module = queue.pop(0)
        for target, imp in sorted(edges[module].items()):
            if target == start:
                return [*paths[module], imp]
            if target in component and target not in paths:
                paths[target] = [*paths[module], imp]
                queue.append(target)
    raise AssertionError(f"no cycle through {start}")


def circles(edges: dict[str, dict[str, Import]]) -> list[list[Import]]:
    """The circles of the import graph, about one for each import that closes one: the
    shortest circle of each strongly connected component, then again without that circle's
    imports, until none is left (a stray import can pull dozens of modules into one
    component; listing a circle through each would bury it)."""
    graph = {module: dict(targets) for module, targets in edges.items()}
    found: list[list[Import]] = []
    while True:
        components = [
            c for c in strongly_connected(graph) if len(c) > 1 or any(m in graph[m] for m in c)
        ]
        if not components:
            return found
        for component in components:
            cycle = min((_cycle(m, component, graph) for m in sorted(component)), key=len)
            found.append(cycle)
            for imp in cycle:
                del graph[imp.importer][imp.target]


def strongly_connected(edges: dict[str, dict[str, Import]]) -> list[set[str]]:
    """Tarjan's algorithm, iteratively: the graph's strongly connected components."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(edges[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    components.append(component)
    return components


def test_no_modules_import_each_other_in_a_circle() -> None:
    edges: dict[str, dict[str, Import]] = {m: {} for m in package_modules()}
    for imp in all_imports():
        if imp.target in edges:
            edges[imp.importer].setdefault(imp.target, imp)  # its first import, for the report
    found = []
    for cycle in circles(edges):
        path = " -> ".join([cycle[0].importer, *(i.target for i in cycle)])
        found.append("\n  ".join([path, *map(str, cycle)]))
    assert not found, "modules importing each other in a circle:\n" + "\n".join(found)


def test_the_checks_see_every_kind_of_import() -> None:
    """Relative imports resolve (to a submodule where there is one), and imports inside
    functions and under TYPE_CHECKING are found: what a hole in the checks above would let
    through."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import http, missing\n"
        "from ..stream.tailer import Tailer\n"
        "from ... import cli, __version__\n"
        "if TYPE_CHECKING:\n"
        "    from ...spark import options\n"
        "def f():\n"
        "    import deltastream.demo\n"
        "    if TYPE_CHECKING:\n"
        "        from ..observability import metrics\n"
    )
    found = parse_imports(PACKAGE / "daemon" / "sinks" / "common.py", source)
    assert [(i.target, i.line, i.where) for i in found] == [
        ("typing", 1, "module"),
        ("deltastream.daemon.sinks.http", 2, "module"),
        ("deltastream.daemon.sinks", 2, "module"),
        ("deltastream.daemon.stream.tailer", 3, "module"),
        ("deltastream.cli", 4, "module"),
        ("deltastream", 4, "module"),
        ("deltastream.spark.options", 6, "TYPE_CHECKING"),
        ("deltastream.demo", 8, "function"),
        ("deltastream.daemon.observability.metrics", 10, "function"),
    ]
    assert {i.importer for i in found} == {"deltastream.daemon.sinks.common"}


def test_network_libraries_stay_in_storage() -> None:
    violations = []
    for imp in all_imports():
        top = imp.target.split(".")[0]
        allowed = imp.importer.startswith(NETWORK_PACKAGES) and not (
            imp.importer.startswith("deltastream.daemon") and top in DAEMON_FORBIDDEN
        )
        if top in STORAGE_ONLY_IMPORTS and not allowed:
            violations.append(str(imp))
    assert not violations, "\n".join(violations)


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
    violations = [
        str(imp)
        for imp in all_imports()
        if not inside(imp.importer, "deltastream.spark")
        and (imp.target.split(".")[0] == "pyspark" or inside(imp.target, "deltastream.spark"))
    ]
    assert not violations, "\n".join(violations)


def test_object_store_clients_load_only_when_a_store_opens() -> None:
    """``import deltastream``, the stores' options and the Spark source's option names load
    no client library (aiobotocore, the Azure SDK, gcloud-aio): each is heavy, and Azure's
    and GCS's are optional extras."""
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


def test_the_readers_load_neither_the_daemon_nor_pandas() -> None:
    """``import deltastream`` and the Spark source load neither the daemon (its names in the
    package root are imported on first use) nor pandas (which pyarrow's
    ``Schema.empty_table``, ``pa.array([])`` and ``pyarrow.dataset`` import): Spark starts
    a fresh Python process for every streaming query, and these were most of its start-up.
    The daemon's names still resolve from the root."""
    code = """
import sys
import deltastream
import deltastream.spark.stream
loaded = sorted(m for m in ("pandas", "deltastream.daemon", "pydantic") if m in sys.modules)
assert loaded == [], loaded
assert deltastream.tail.__module__ == "deltastream.daemon.api"
assert "deltastream.daemon" in sys.modules and "Tailer" in dir(deltastream)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_store_without_its_extra_is_one_clear_error() -> None:
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
