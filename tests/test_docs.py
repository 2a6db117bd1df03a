"""The documentation site (mkdocs.yml, docs/): it builds with ``mkdocs build --strict``, its
command-line reference is the parser's, its troubleshooting page names every error, its API
page every public name, and every example it shows runs (tests/docs_examples.py). README.md
stays short, and its links into docs/ lead to pages (and headings) that exist."""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import docs_examples as dx
import pytest
from conftest import S3Server

import deltastream
import deltastream.errors

ROOT = dx.ROOT
DOCS = dx.DOCS
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)(?P<info>[^\n`]*)$")
#: Languages of code a reader runs: such a block must be an example file, included.
RUNNABLE = {"python", "py", "sh", "bash", "shell", "toml", "pycon"}
SNIPPET = re.compile(r'^\s*--8<-- "(?P<path>[^"]+)"\s*$')
#: README.md is the front page: what deltastream is, the set-up, examples, links to docs/.
README_MAX_LINES = 200
#: A Markdown link's target: [text](target).
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def _gen_cli() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_cli", DOCS / "gen_cli.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _code_blocks(page: Path) -> list[tuple[int, str, list[str]]]:
    """Each fenced block of a page: its line, its language, its lines."""
    blocks: list[tuple[int, str, list[str]]] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        fence, language = match["fence"], match["info"].strip().split(" ")[0].lower()
        start, body = i + 1, []
        i += 1
        while i < len(lines) and lines[i].strip() != fence:
            body.append(lines[i])
            i += 1
        blocks.append((start, language, body))
        i += 1
    return blocks


def test_cli_reference_is_generated_from_the_parser() -> None:
    """docs/cli/*.md are what docs/gen_cli.py renders from deltastream.cli's parser now."""
    pages = _gen_cli().render()
    committed = {p.name: p.read_text() for p in (DOCS / "cli").glob("*.md") if p.name != "index.md"}
    stale = sorted(n for n in pages.keys() | committed.keys() if pages.get(n) != committed.get(n))
    assert not stale, (
        f"docs/cli/ is out of date with deltastream's command line ({', '.join(stale)}): "
        "regenerate it with `python docs/gen_cli.py` and commit the result"
    )


def test_every_command_has_a_page_in_the_nav_and_the_overview() -> None:
    pages = _gen_cli().render()
    nav = (ROOT / "mkdocs.yml").read_text()
    overview = (DOCS / "cli" / "index.md").read_text()
    for name in pages:
        assert f"cli/{name}" in nav, f"mkdocs.yml's nav lacks cli/{name}"
        assert f"]({name})" in overview, f"docs/cli/index.md does not link to {name}"


def test_following_guide_names_every_server_key() -> None:
    from deltastream.daemon.service.config import SERVER_KEYS

    text = (DOCS / "following.md").read_text()
    missing = [key for key in SERVER_KEYS if f"`{key}`" not in text]
    assert not missing, f"docs/following.md does not describe [server] keys {missing}"


def test_troubleshooting_covers_every_error_class() -> None:
    """Each public exception class has its own heading on the troubleshooting page."""
    text = (DOCS / "troubleshooting.md").read_text()
    headings = set(re.findall(r"^#+ `(\w+)`", text, re.MULTILINE))
    classes = {
        name
        for name in deltastream.errors.__all__
        if inspect.isclass(getattr(deltastream.errors, name))
        and issubclass(getattr(deltastream.errors, name), deltastream.errors.DeltaStreamError)
    }
    missing = sorted(classes - headings)
    assert not missing, f"docs/troubleshooting.md has no heading for: {', '.join(missing)}"
    unknown = sorted(headings - classes)
    assert not unknown, f"docs/troubleshooting.md has headings for unknown errors: {unknown}"


def test_api_page_documents_every_public_name() -> None:
    text = (DOCS / "api.md").read_text()
    documented = set(re.findall(r"^::: deltastream\.(\w+)$", text, re.MULTILINE))
    missing = sorted(set(deltastream.__all__) - documented - {"__version__"})
    assert not missing, f"docs/api.md lacks `::: deltastream.NAME` for: {', '.join(missing)}"


def test_every_runnable_code_block_is_an_example_that_runs() -> None:
    """A block of Python, shell or TOML on a page is one example file, included whole; and
    every example file is included by a page and run by a test."""
    included: set[str] = set()
    for page in _pages():
        for line, language, body in _code_blocks(page):
            snippets = [SNIPPET.match(b) for b in body if b.strip()]
            if all(snippets) and snippets:
                for s in snippets:
                    assert s is not None
                    included.add(s["path"])
                continue
            assert language not in RUNNABLE, (
                f"{page.relative_to(ROOT)}:{line}: a {language} block written in the page; "
                "put it in a file under docs/examples/ (run by tests/test_docs.py) and include "
                'it with --8<-- "docs/examples/…"'
            )
    for path in included:
        assert (ROOT / path).is_file(), f"a page includes {path}, which does not exist"
    examples = {
        p.relative_to(ROOT).as_posix()
        for p in dx.EXAMPLES.rglob("*")
        if p.is_file() and p.suffix in dx.SUFFIXES
    }
    assert not examples - included, f"examples no page includes: {sorted(examples - included)}"
    run = {
        p.relative_to(ROOT).as_posix()
        for s in [*dx.scenarios(), dx.SPARK]
        for p in dx.example_files(s)
    } | {dx.MAKE_EVENTS.relative_to(ROOT).as_posix()}
    assert not examples - run, f"examples no test runs: {sorted(examples - run)}"


@pytest.mark.parametrize("scenario", sorted(set(dx.scenarios()) - dx.NEEDS_S3))
def test_examples_run(scenario: str, tmp_path: Path) -> None:
    env = dx.prepare(tmp_path, scenario)
    for path in dx.example_files(scenario):
        dx.run_example(path, tmp_path, env)


@pytest.mark.parametrize("scenario", sorted(dx.NEEDS_S3))
def test_object_store_examples_run(scenario: str, tmp_path: Path, s3_server: S3Server) -> None:
    """The S3 examples, against a local S3 server standing in for an S3-compatible store
    (its endpoint in ``S3_ENDPOINT_URL``, the keys in the environment, as the page says)."""
    env = dx.prepare(tmp_path, scenario)
    client = s3_server.client()
    if "lake" not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
        client.create_bucket(Bucket="lake")
    events = tmp_path / "events"
    for path in sorted(events.rglob("*")):
        if path.is_file():
            key = f"events/{path.relative_to(events).as_posix()}"
            client.put_object(Bucket="lake", Key=key, Body=path.read_bytes())
    env["S3_ENDPOINT_URL"] = s3_server.endpoint
    for path in dx.example_files(scenario):
        dx.run_example(path, tmp_path, env)


def test_site_builds_strict(tmp_path: Path) -> None:
    """``mkdocs build --strict``, as CI runs it: any warning (a broken link, a missing
    snippet, an object mkdocstrings cannot find) fails the build."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    began = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    took = time.monotonic() - began
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "cli" / "tail" / "index.html").is_file()
    # One example's text reaches its page: snippets are included, not left as markers.
    tail_page = (tmp_path / "site" / "cli" / "tail" / "index.html").read_text()
    assert "--8&lt;--" not in tail_page and "--8<--" not in tail_page
    print(f"mkdocs build --strict: {took:.1f}s")


def _slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) and GitHub give a heading's text."""
    text = re.sub(r"[^\w\s-]", "", heading).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    """The anchors of a page's headings (outside code blocks), as MkDocs numbers repeats."""
    anchors: set[str] = set()
    in_code = False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            in_code = not in_code
            continue
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*$", line)
        if heading and not in_code:
            slug, n = _slug(heading[1]), 1
            while slug in anchors:
                slug = f"{_slug(heading[1])}_{n}"
                n += 1
            anchors.add(slug)
    return anchors


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): it is the front page; "
        "put the details in docs/ and link to them"
    )


def test_readme_links_into_docs_resolve() -> None:
    """Every relative link of README.md into docs/ names a file there (and a heading of it,
    when it has an anchor); its own #anchors name its headings. Relative links work on
    GitHub and in a checkout."""
    readme = ROOT / "README.md"
    targets = [m["target"] for m in LINK.finditer(readme.read_text())]
    into_docs = [t for t in targets if t.startswith("docs/")]
    assert into_docs, "README.md links to no page of docs/"
    broken = []
    for target in targets:
        path, _, anchor = target.partition("#")
        if path.startswith("docs/"):
            page = ROOT / path
        elif not path and anchor:
            page = readme
        else:
            continue  # another site, or a file outside docs/
        if not page.is_file() or (anchor and anchor not in _anchors(page)):
            broken.append(target)
    assert not broken, f"README.md links to what does not exist: {broken}"
