"""Prometheus's own tools for tests of ``/metrics`` and of deploy/'s rules and dashboard:
``promtool`` and a real ``prometheus`` server, both from Debian's ``prometheus`` package
(``.ci/run`` installs it). A missing binary fails the test, naming the package."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from conftest import free_port

__all__ = [
    "PrometheusServer",
    "Series",
    "families",
    "promtool",
    "run_prometheus",
    "series",
    "until",
]


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not installed: it comes with Debian's prometheus package "
            "(apt-get install -y --no-install-recommends prometheus; .ci/run installs it)"
        )
    return path


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``promtool ARGS`` (with ``stdin``), capturing its output."""
    return subprocess.run(
        [binary("promtool"), *args], input=stdin, capture_output=True, text=True, timeout=60
    )


#: One sample's identity in an exposition: metric name and sorted label pairs.
Series = tuple[str, tuple[tuple[str, str], ...]]

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def series(text: str) -> dict[Series, float]:
    """Every sample of a text exposition, by series."""
    found: dict[Series, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, labels, value = match.groups()
        pairs = tuple(sorted(_LABEL.findall(labels or "")))
        found[(name, pairs)] = float(value)
    return found


def families(text: str) -> dict[str, str]:
    """The metric families an exposition declares (``# TYPE``), with their types."""
    return dict(line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE "))


async def until(condition: Callable[[], Awaitable[bool]], within: float = 60.0) -> None:
    """Wait until ``await condition()`` holds, asking every 100 ms; fail after ``within`` s."""
    with anyio.fail_after(within):
        for _ in itertools.count():
            if await condition():
                return
            await anyio.sleep(0.1)


@dataclass(frozen=True)
class PrometheusServer:
    url: str
    log: Path

    async def query(self, expr: str) -> list[dict[str, Any]]:
        """The result of an instant query (``/api/v1/query``); a failed query fails."""
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{self.url}/api/v1/query", params={"query": expr}) as resp,
        ):
            body = await resp.json()
        assert body["status"] == "success", (expr, body)
        result = body["data"]["result"]
        assert isinstance(result, list)
        return result

    async def value(self, expr: str) -> float | None:
        """The value of an instant query with at most one series (``None``: none)."""
        result = await self.query(expr)
        assert len(result) <= 1, (expr, result)
        return float(result[0]["value"][1]) if result else None

    async def get(self, path: str) -> Any:
        async with aiohttp.ClientSession() as http, http.get(f"{self.url}{path}") as resp:
            assert resp.status == 200, await resp.text()
            return await resp.json()


@contextmanager
def run_prometheus(
    tmp_path: Path, target: str, *, rule_files: Sequence[Path] = ()
) -> Iterator[PrometheusServer]:
    """A Prometheus server on 127.0.0.1 at a free port, scraping ``target`` (``host:port``,
    job ``deltastream``) every 250 ms and evaluating ``rule_files`` as often, its data in
    ``tmp_path``; stopped on exit."""
    directory = tmp_path / "prometheus"
    directory.mkdir()
    config = {
        "global": {"scrape_interval": "250ms", "evaluation_interval": "250ms"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {
                "job_name": "deltastream",
                "scrape_timeout": "250ms",
                "static_configs": [{"targets": [target]}],
            }
        ],
    }
    config_file = directory / "prometheus.yml"
    config_file.write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = directory / "prometheus.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [
                binary("prometheus"),
                f"--config.file={config_file}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, f"prometheus exited:\n{log.read_text()}"
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline, f"prometheus not ready:\n{log.read_text()}"
            time.sleep(0.1)
        yield PrometheusServer(url, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
