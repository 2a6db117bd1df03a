"""The S3 fault scenario shared by ``test_s3_faults.py`` and ``benchmarks/soak_s3_faults.py``.

A table lives on a moto S3 server; deltalake writes it directly (appends, updates, deletes
and merges, with the change data feed on) while ``deltastream serve`` follows it in a
subprocess through a :class:`faultproxy.FaultProxy` that injects S3 faults (503 SlowDown,
500 InternalError, connection resets, lost responses, delays) into a fraction of the
requests, phase by phase (e.g. 10% then 30%). The daemon runs two streams of the table, a
``jsonl`` sink (``snapshot-and-follow`` from version 0: the snapshot of version 0, then every
change) and a ``parquet`` sink (``follow`` from version 0, small deliveries); both keep their
state directory on S3, behind the same proxy.

While it runs, the sinks are watched (every 50 ms) to time each row from its version's
commit (when the writer's call returned) to its appearance in the sink, and ``/metrics`` is
scraped. Then the writer stops, the daemon catches up (its committed positions on S3 reach
the last version), is stopped with SIGTERM, and each sink's rows are compared, as a multiset
of ``(_commit_version, _change_type, id, name, part)``, with delta-rs's ``load_cdf`` of a
local copy of the table (delta-rs 1.6's ``load_cdf`` hangs listing moto's server).

:func:`run_scenario` returns a :class:`Report`; :func:`format_report` prints it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
from faultproxy import FAULT_KINDS, FaultEvent, FaultProxy
from tailing import CDF, Row, Writer, batch, change_key

__all__ = [
    "Phase",
    "Report",
    "Scenario",
    "SinkResult",
    "format_report",
    "moto_server",
    "run_scenario",
]

CREDENTIALS = {
    "access_key_id": "testing",
    "secret_access_key": "testing",
    "region": "us-east-1",
}
SINKS = ("jsonl", "parquet")
#: The streams of the daemon, by sink kind.
STREAM_NAMES = {"jsonl": "j", "parquet": "p"}
RETRY_METRICS = ("deltastream_storage_retries_total", "deltastream_sink_retries_total")


@dataclass(frozen=True)
class Phase:
    seconds: float
    rate: float  # fraction of requests that get a fault


@dataclass(frozen=True)
class Scenario:
    phases: tuple[Phase, ...] = (Phase(120, 0.10), Phase(120, 0.30))
    #: Seconds the writer waits between commits (a commit itself takes 0.1-0.5 s on moto).
    interval: float = 0.5
    seed: int = 20261122
    weights: Mapping[str, float] = field(default_factory=lambda: dict.fromkeys(FAULT_KINDS, 1.0))
    poll_interval: float = 0.5
    #: Rows per delivery of the parquet stream (versions larger than that are split).
    parquet_max_rows: int = 40
    checkpoint_every_versions: int = 20
    #: Seconds the daemon gets to deliver the last version once the writer stopped.
    catch_up_timeout: float = 120.0
    initial_rows: int = 12
    #: The daemon's S3 ``max_attempts`` (None: deltastream's default). A low value makes
    #: requests fail for good now and then, so that streams restart in mid-delivery.
    max_attempts: int | None = None


@dataclass
class SinkResult:
    name: str
    expected: int
    delivered: int
    lost: Counter[Row]
    repeated: Counter[Row]  # rows delivered more often than they changed
    unexpected: Counter[Row]  # rows that are no change of the table at all
    delays: list[float]  # seconds, one per delivered row of a version the writer committed
    caught_up: bool

    @property
    def ok(self) -> bool:
        return self.caught_up and not (self.lost or self.repeated or self.unexpected)


@dataclass
class Report:
    scenario: Scenario
    moto: str
    proxy: str
    first_version: int
    last_version: int
    commits: int
    writer_error: str | None
    #: Proxy counts per phase, then ``catch-up`` (up to the daemon's exit), and ``total``.
    faults: dict[str, dict[str, int]]
    sinks: dict[str, SinkResult]
    metrics: dict[str, dict[str, float] | None]  # retry metrics: samples by labels, or None
    restarts: dict[str, float]
    up: dict[str, float]
    died: str | None  # the daemon exited before it was told to stop
    exit_status: int | None
    stop_seconds: float | None
    log_counts: dict[str, int]
    log_excerpt: list[str]
    fault_events: list[FaultEvent]
    elapsed: float

    @property
    def survived(self) -> bool:
        return self.died is None and self.exit_status == 0

    @property
    def ok(self) -> bool:
        return (
            self.survived and self.writer_error is None and all(s.ok for s in self.sinks.values())
        )


# --------------------------------------------------------------------------------------
# Pieces
# --------------------------------------------------------------------------------------


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """A moto S3 server on a free 127.0.0.1 port; yields its endpoint."""
    from conftest import free_port
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's access log
    for key, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        os.environ.setdefault(key, value)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def s3_client(endpoint: str) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=CREDENTIALS["access_key_id"],
        aws_secret_access_key=CREDENTIALS["secret_access_key"],
        region_name=CREDENTIALS["region"],
    )


def deltalake_options(endpoint: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": CREDENTIALS["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": CREDENTIALS["secret_access_key"],
        "AWS_REGION": CREDENTIALS["region"],
        "AWS_ALLOW_HTTP": "true",
    }


class SinkWatch:
    """Notes when each row first appears in a sink. A row is ``(key, n)``: the ``n``-th row
    with that key in the sink's current content (a restart may truncate a jsonl file or
    delete parquet files past the committed position; rows written again keep their first
    appearance)."""

    def __init__(self) -> None:
        self.first_seen: dict[tuple[Row, int], float] = {}
        self._counts: Counter[Row] = Counter()

    def _saw(self, keys: Sequence[Row], now: float) -> None:
        for key in keys:
            n = self._counts[key]
            self._counts[key] = n + 1
            self.first_seen.setdefault((key, n), now)

    def poll(self) -> None:
        raise NotImplementedError

    def rows(self) -> list[Row]:
        """The sink's whole current content, in order."""
        raise NotImplementedError

    def delays(self, committed: Mapping[int, float]) -> list[float]:
        """Seconds from commit to first appearance of each row of the final content whose
        version the writer committed."""
        counts: Counter[Row] = Counter()
        out = []
        for key in self.rows():
            n = counts[key]
            counts[key] = n + 1
            version = key[0]
            seen = self.first_seen.get((key, n))
            if version in committed and seen is not None:
                out.append(seen - committed[version])
        return out


class JsonlWatch(SinkWatch):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self._offset = 0  # end of the last complete line read

    def poll(self) -> None:
        now = time.time()
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < self._offset:  # truncated by a restart: count again
                    data = f.read(size)
                    end = data.rfind(b"\n") + 1
                    self._counts = Counter(_jsonl_keys(data[:end]))
                    self._offset = end
                    return
                f.seek(self._offset)
                data = f.read(size - self._offset)
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        if end:
            self._saw(_jsonl_keys(data[:end]), now)
            self._offset += end

    def rows(self) -> list[Row]:
        try:
            return _jsonl_keys(self.path.read_bytes())
        except FileNotFoundError:
            return []


def _jsonl_keys(data: bytes) -> list[Row]:
    return [change_key(json.loads(line)) for line in data.splitlines() if line.strip()]


class ParquetWatch(SinkWatch):
    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory
        self._files: dict[str, list[Row]] = {}

    def _names(self) -> list[str]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if n.endswith(".parquet") and not n.startswith("."))

    def poll(self) -> None:
        now = time.time()
        names = self._names()
        for gone in set(self._files) - set(names):
            self._counts.subtract(self._files.pop(gone))
        for name in names:
            if name in self._files:
                continue
            try:
                keys = _parquet_keys(self.directory / name)
            except FileNotFoundError:  # deleted by a restart meanwhile
                continue
            self._files[name] = keys
            self._saw(keys, now)

    def rows(self) -> list[Row]:
        return [k for name in self._names() for k in _parquet_keys(self.directory / name)]


def _parquet_keys(path: Path) -> list[Row]:
    return [change_key(r) for r in pq.read_table(path).to_pylist()]


def scrape(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            text: str = response.read().decode()
            return text
    except OSError:
        return None


def metric_samples(text: str, name: str) -> dict[str, float] | None:
    """The samples of one metric, by label set (``""`` without labels); None if the
    exposition does not have that metric at all."""
    samples: dict[str, float] = {}
    pattern = re.compile(rf"^{re.escape(name)}(\{{.*\}})?\s+(\S+)")
    declared = False
    for line in text.splitlines():
        if line.startswith(("# TYPE ", "# HELP ")) and line.split()[2] == name:
            declared = True
            continue
        match = pattern.match(line)
        if match:
            samples[match.group(1) or ""] = float(match.group(2))
    return samples if samples or declared else None


def by_table(samples: Mapping[str, float] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, value in (samples or {}).items():
        match = re.search(r'table="([^"]*)"', labels)
        out[match.group(1) if match else labels] = value
    return out


def committed_version(client: Any, bucket: str, key: str) -> int:
    """The last version a stream fully delivered, from its ``position.json`` (-1: none)."""
    try:
        raw = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        position = json.loads(raw)["position"]
    except Exception:
        return -1
    return int(position["version"]) - 1  # the next version to deliver, minus one


def local_copy(client: Any, bucket: str, prefix: str, target: Path) -> str:
    """Download a table (delta-rs 1.6's ``load_cdf`` hangs listing moto's server)."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
    for page in pages:
        for obj in page.get("Contents", []):
            path = target / obj["Key"][len(prefix) + 1 :]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read())
    return str(target)


def expected_changes(uri: str, start: int, end: int) -> Counter[Row]:
    table = DeltaTable(uri)
    cdf = pa.table(table.load_cdf(starting_version=start, ending_version=end))
    return Counter(change_key(r) for r in cdf.to_pylist())


def compare(
    name: str, expected: Counter[Row], rows: list[Row], delays: list[float], caught_up: bool
) -> SinkResult:
    got = Counter(rows)
    extra = got - expected
    return SinkResult(
        name=name,
        expected=sum(expected.values()),
        delivered=len(rows),
        lost=expected - got,
        repeated=Counter({k: n for k, n in extra.items() if k in expected}),
        unexpected=Counter({k: n for k, n in extra.items() if k not in expected}),
        delays=delays,
        caught_up=caught_up,
    )


def config_toml(
    scenario: Scenario,
    uri: str,
    bucket: str,
    state_prefix: str,
    out: Path,
    proxy_url: str,
    http: str,
) -> str:
    settings = {"endpoint_url": proxy_url, **CREDENTIALS}
    if scenario.max_attempts is not None:
        settings["max_attempts"] = str(scenario.max_attempts)
    options = "{ " + ", ".join(f'{k} = "{v}"' for k, v in settings.items()) + " }"
    return f"""
[server]
http = "{http}"
log_level = "info"
shutdown_grace = 20

[defaults]
uri = "{uri}"
poll_interval = {scenario.poll_interval}
from = "0"
storage_options = {options}
state_storage_options = {options}
checkpoint_every_versions = {scenario.checkpoint_every_versions}

[[tables]]
name = "{STREAM_NAMES["jsonl"]}"
state = "s3://{bucket}/{state_prefix}/{STREAM_NAMES["jsonl"]}"
mode = "snapshot-and-follow"
sink = "jsonl:{out / "changes.jsonl"}"

[[tables]]
name = "{STREAM_NAMES["parquet"]}"
state = "s3://{bucket}/{state_prefix}/{STREAM_NAMES["parquet"]}"
mode = "follow"
max_rows_per_delivery = {scenario.parquet_max_rows}
sink = "parquet:{out / "parquet"}"
"""


# --------------------------------------------------------------------------------------
# The scenario
# --------------------------------------------------------------------------------------


def run_scenario(
    scenario: Scenario,
    endpoint: str,
    workdir: Path,
    *,
    progress: Any = None,
) -> Report:
    """Run ``scenario`` against the moto server at ``endpoint``, with files under
    ``workdir``. ``progress(message)`` is called at each step (default: nothing)."""
    from conftest import free_port

    say = progress or (lambda message: None)
    started = time.monotonic()
    client = s3_client(endpoint)
    bucket = f"faults-{uuid.uuid4().hex[:10]}"
    client.create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/table"
    writer_options = deltalake_options(endpoint)
    write_deltalake(
        uri,
        batch(range(scenario.initial_rows)),
        partition_by=["part"],
        configuration=CDF,
        storage_options=writer_options,
    )
    out = workdir / "out"
    out.mkdir(parents=True, exist_ok=True)
    jsonl, parquet_dir = JsonlWatch(out / "changes.jsonl"), ParquetWatch(out / "parquet")
    watches: dict[str, SinkWatch] = {"jsonl": jsonl, "parquet": parquet_dir}
    log_path = workdir / "daemon.log"
    proxy = FaultProxy(
        endpoint, rate=scenario.phases[0].rate, weights=scenario.weights, seed=scenario.seed
    )
    faults: dict[str, dict[str, int]] = {}
    last_metrics: list[str] = []
    before_stop = ""
    died: str | None = None
    exit_status: int | None = None
    stop_seconds: float | None = None
    # Until stopped; its ``committed`` times each version for the delays.
    writer = Writer(uri, None, interval=scenario.interval, storage_options=writer_options)
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            for w in watches.values():
                w.poll()
            watching.wait(0.05)

    def write() -> None:
        with contextlib.suppress(BaseException):  # the report tells writer.error
            writer.run()

    def scrape_metrics() -> None:
        while not watching.is_set():
            text = scrape(metrics_url)
            if text is not None:
                last_metrics[:] = [text]
            watching.wait(1.0)

    with proxy:
        # Picked once the proxy listens, so that the two cannot get the same free port.
        proxy_url = proxy.url
        http = f"127.0.0.1:{free_port()}"
        metrics_url = f"http://{http}/metrics"
        config = workdir / "deltastream.toml"
        config.write_text(config_toml(scenario, uri, bucket, "state", out, proxy_url, http))
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "AWS_EC2_METADATA_DISABLED": "true"}
        with open(log_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "deltastream", "serve", "--config", str(config)],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
            )
        watcher = threading.Thread(target=watch, name="sink-watch", daemon=True)
        scraper = threading.Thread(target=scrape_metrics, name="scrape", daemon=True)
        writer_thread = threading.Thread(target=write, name="writer", daemon=True)
        try:
            watcher.start()
            scraper.start()
            writer_thread.start()
            before = proxy.counts()
            for i, phase in enumerate(scenario.phases, 1):
                proxy.rate = phase.rate
                say(f"phase {i}: {phase.rate:.0%} faults for {phase.seconds:g} s")
                deadline = time.monotonic() + phase.seconds
                while time.monotonic() < deadline and died is None:
                    if proc.poll() is not None:
                        died = f"the daemon exited by itself with status {proc.returncode}"
                    time.sleep(0.2)
                now = proxy.counts()
                faults[f"phase {i} ({phase.rate:.0%}, {phase.seconds:g} s)"] = _diff(now, before)
                before = now
            writer.stop()
            writer_thread.join()
            last = DeltaTable(uri, storage_options=writer_options).version()
            say(f"writer stopped at version {last}; waiting for the daemon to catch up")
            states = {kind: f"state/{STREAM_NAMES[kind]}/position.json" for kind in SINKS}
            caught_up = dict.fromkeys(SINKS, False)
            deadline = time.monotonic() + scenario.catch_up_timeout
            while died is None and time.monotonic() < deadline and not all(caught_up.values()):
                for kind, key in states.items():
                    caught_up[kind] = committed_version(client, bucket, key) >= last
                if proc.poll() is not None:
                    died = f"the daemon exited by itself with status {proc.returncode}"
                time.sleep(0.25)
            time.sleep(1.2)  # one more scrape of /metrics
            before_stop = last_metrics[0] if last_metrics else ""
            if died is None:
                say("stopping the daemon (SIGTERM)")
                t0 = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                try:
                    exit_status = proc.wait(timeout=60)
                    stop_seconds = time.monotonic() - t0
                except subprocess.TimeoutExpired:
                    died = "the daemon did not exit within 60 s of SIGTERM"
            faults["catch-up and stop"] = _diff(proxy.counts(), before)
            faults["total"] = proxy.counts()
            fault_events = proxy.events()
        finally:
            writer.stop()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            watching.set()
            watcher.join()
            scraper.join()
            writer_thread.join(timeout=60)
    for w in watches.values():
        w.poll()

    say("comparing the sinks with delta-rs's load_cdf")
    with tempfile.TemporaryDirectory(prefix="faults-oracle-") as tmp:
        copy = local_copy(client, bucket, "table", Path(tmp))
        expected = expected_changes(copy, 0, last)
    sinks = {
        kind: compare(kind, expected, w.rows(), w.delays(writer.committed), caught_up[kind])
        for kind, w in watches.items()
    }
    text = last_metrics[0] if last_metrics else ""
    log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
    log_lines = log_text.splitlines()
    notable = [ln for ln in log_lines if re.search(r" (WARNING|ERROR|CRITICAL) ", ln)]
    return Report(
        scenario=scenario,
        moto=endpoint,
        proxy=proxy_url,
        first_version=min(writer.committed, default=0),
        last_version=last,
        commits=len(writer.committed),
        writer_error=repr(writer.error) if writer.error else None,
        faults=faults,
        sinks=sinks,
        metrics={name: metric_samples(text, name) for name in RETRY_METRICS},
        restarts=by_table(metric_samples(text, "deltastream_restarts_total")),
        up=by_table(metric_samples(before_stop, "deltastream_stream_running")),
        died=died,
        exit_status=exit_status,
        stop_seconds=stop_seconds,
        log_counts={
            "lines": len(log_lines),
            "warnings": sum(" WARNING " in ln for ln in log_lines),
            "errors": sum(" ERROR " in ln for ln in log_lines),
            "restarts": sum("restarting in" in ln for ln in log_lines),
            "tracebacks": log_text.count("Traceback"),
        },
        log_excerpt=notable[-30:] if notable else log_lines[-10:],
        fault_events=fault_events,
        elapsed=time.monotonic() - started,
    )


def _diff(now: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    return {k: now[k] - before.get(k, 0) for k in now}


# --------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _metric_text(samples: Mapping[str, float] | None) -> str:
    if samples is None:
        return "n/a (not in /metrics)"
    total = sum(samples.values())
    parts = ", ".join(f"{labels or '{}'} {v:g}" for labels, v in sorted(samples.items()))
    return f"{total:g}" + (f"  ({parts})" if parts else "")


def _rows(counter: Counter[Row], limit: int = 8) -> str:
    items = sorted(counter.items())[:limit]
    more = len(counter) - len(items)
    text = "; ".join(f"{k} x{n}" for k, n in items)
    return text + (f"; ... {more} more" if more > 0 else "")


def format_report(report: Report) -> str:
    s = report.scenario
    lines = []
    phases = ", then ".join(f"{p.seconds:g} s at {p.rate:.0%}" for p in s.phases)
    lines.append(f"S3 fault soak: {phases} faults; writer pause {s.interval:g} s")
    weights = ", ".join(f"{k} {v:g}" for k, v in s.weights.items())
    lines.append(
        f"setup   : moto {report.moto}, fault proxy {report.proxy} (seed {s.seed}; weights "
        f"{weights}; delays 0.2-2 s)"
    )
    lines.append(
        f"daemon  : deltastream serve, 2 streams (jsonl snapshot-and-follow from 0, parquet "
        f"follow from 0, {s.parquet_max_rows} rows/delivery), state on S3 via the proxy, "
        f"poll {s.poll_interval:g} s, S3 max_attempts "
        f"{s.max_attempts if s.max_attempts is not None else 'default'}"
    )
    lines.append(
        f"table   : {report.commits} commits by the writer (versions "
        f"{report.first_version}..{report.last_version}); "
        f"writer error: {report.writer_error or 'none'}"
    )
    lines.append("")
    header = f"{'proxy':<26}{'requests':>9}" + "".join(f"{k:>10}" for k in FAULT_KINDS)
    lines.append(header + f"{'faults':>9}")
    for label, counts in report.faults.items():
        lines.append(
            f"{label:<26}{counts['requests']:>9}"
            + "".join(f"{counts[k]:>10}" for k in FAULT_KINDS)
            + f"{counts['faults']:>9}"
        )
    lines.append("")
    lines.append(
        f"{'sink':<9}{'expected':>9}{'delivered':>10}{'lost':>7}{'repeated':>9}"
        f"{'unexpected':>11}{'caught up':>10}   delay p50 / p99 / max (rows)"
    )
    for r in report.sinks.values():
        delay = (
            f"{pct(r.delays, 50):.2f} / {pct(r.delays, 99):.2f} / {max(r.delays):.2f} s "
            f"({len(r.delays)})"
            if r.delays
            else "n/a"
        )
        lines.append(
            f"{r.name:<9}{r.expected:>9}{r.delivered:>10}{sum(r.lost.values()):>7}"
            f"{sum(r.repeated.values()):>9}{sum(r.unexpected.values()):>11}"
            f"{'yes' if r.caught_up else 'NO':>10}   {delay}"
        )
    all_delays = [d for r in report.sinks.values() for d in r.delays]
    if all_delays:
        lines.append(
            f"delivery delay, both sinks: p50 {pct(all_delays, 50):.2f} s, "
            f"p99 {pct(all_delays, 99):.2f} s, mean {statistics.mean(all_delays):.2f} s"
        )
    lines.append("")
    for name, samples in report.metrics.items():
        lines.append(f"retries : {name} = {_metric_text(samples)}")
    lines.append(
        "          (aiohttp itself re-sends an idempotent request once when its connection "
        "drops: some reset/lost faults are retried there, unseen and uncounted)"
    )
    restarts = ", ".join(f"{k}={v:g}" for k, v in sorted(report.restarts.items())) or "n/a"
    lines.append(f"restarts: deltastream_restarts_total {restarts}")
    c = report.log_counts
    lines.append(
        f"log     : {c['lines']} lines, {c['warnings']} warnings, {c['errors']} errors, "
        f"{c['restarts']} 'restarting' lines, {c['tracebacks']} tracebacks"
    )
    if report.died:
        status = f"DIED: {report.died}"
    else:
        status = f"survived; exit status {report.exit_status} after SIGTERM"
        if report.stop_seconds is not None:
            status += f" ({report.stop_seconds:.1f} s to stop)"
    up = ", ".join(f"{k}={v:g}" for k, v in sorted(report.up.items())) or "n/a"
    lines.append(f"daemon  : {status}; deltastream_stream_running before the stop: {up}")
    for r in report.sinks.values():
        if r.lost:
            lines.append(f"LOST in {r.name}: {_rows(r.lost)}")
        if r.repeated:
            lines.append(f"REPEATED in {r.name}: {_rows(r.repeated)}")
        if r.unexpected:
            lines.append(f"UNEXPECTED in {r.name}: {_rows(r.unexpected)}")
    if not report.ok or c["errors"] or c["tracebacks"]:
        lines.append("daemon log (warnings and errors, last 30):")
        lines.extend(f"  {ln}" for ln in report.log_excerpt)
    lines.append(f"elapsed : {report.elapsed:.0f} s")
    lines.append(f"RESULT: {'PASS' if report.ok else 'FAIL'}")
    return "\n".join(lines)
