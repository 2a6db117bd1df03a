"""Replica groups, measured: how long a group takes to run a dead replica's streams again,
and how many requests its leases cost per replica.

    python tests/benchmarks/bench_replicas.py takeover [--kills 20] [--lease-ttl 15]
    python tests/benchmarks/bench_replicas.py traffic [--streams 10000] [--store local|s3]
    python tests/benchmarks/bench_replicas.py steady [--seconds 60]    (as root: unshare)
    python tests/benchmarks/bench_replicas.py handover [--rounds 10] [--compare REV]
        [--tables 8] [--latency 20,50] [--store s3|azure|gcs]
    python tests/benchmarks/bench_replicas.py requests [--store s3|azure|gcs]

``takeover``: two ``deltastream serve`` replicas share a few local tables; each round kills
the replica running them and times, through the survivor's ``/healthz``, how long until it
runs every stream, then starts a new replica and waits for the group to rebalance. Two ways
to die: ``kill -9`` (the survivor, on the same machine, sees the process gone at once) and a
node loss (``SIGSTOP``: the process is there but silent, as a replica on a lost node is; the
survivor waits for a whole lease_ttl of unchanged heartbeat, then takes over). Prints p50,
p99 and max of each.

``traffic``: two replicas of a configuration of ``--streams`` streams (all following one
small table, each into its own output and state) run for ``--seconds``; the requests each
replica made to the lease directory (``deltastream_lease_requests_total``) per second, with
the leases in a local directory or on S3 (moto's server; the states stay local). There is
no reference implementation to compare with: the figure to read is that it does not grow
with the number of streams (run it with 100 and 10,000).

``steady``: three replicas of six tables (8 shards, lease_ttl 3 s), two in pid namespaces of
their own on this host's name and boot (``unshare --pid --fork --mount-proc``: containers
with the host's name), one with a host name and boot id of its own; once balanced, for
``--seconds``, how many shards each took and lost, and in how many /healthz polls a stream
was owned by two (all three must stay 0).

``requests``: what one request costs on ``--store``'s emulator through the same latency
proxy as ``handover`` (20-50 ms): the median of a PUT, a tagged read (the bytes and their
version tag: what a replica reads of each changed lease record), a GET and a LIST, and of
16 tagged reads and 16 PUTs at once (a replica's batch).

``handover``: two replicas of ``--tables`` local tables whose states and leases are on an
object store (``--store``: S3 on moto's server, Azure on Azurite, GCS on
gcp-storage-emulator, as the tests start them), default shards
(64) and lease_ttl (15 s); each round SIGTERMs the replica that started first and times
until the survivor runs every stream (owns it) and until every stream is past its start-up
(``following``: delivering again), then starts a new replica and times the join: from its
``/healthz`` first answering until the group is balanced again (each replica holds its
share of the shards, by ``/metrics``) and every stream is following (``rebalance_delay``
is 2 s).
With ``--compare REV`` each round does the same, first with deltastream as of git revision
REV (its ``deltastream/`` extracted to a temporary directory, run with ``PYTHONPATH``), then
with this checkout: before and after, side by side under the same load. ``--latency 20,50``
sends the replicas' requests through tests/faultproxy.py, each delayed 20-50 ms, as a real
store's round trip is (the emulators' own is a few ms).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
from deltalake import write_deltalake


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Replica:
    started: list[Replica] = []  # noqa: RUF012 (every replica of the run, for the cleanup)

    def __init__(
        self,
        config: Path,
        log: Path,
        prefix: tuple[str, ...] = (),
        code: Path | None = None,
    ) -> None:
        """``code``: a directory holding the ``deltastream`` package to run instead of this
        checkout's (run from there, with it on ``PYTHONPATH``)."""
        Replica.started.append(self)
        self.port = free_port()
        self.process = subprocess.Popen(
            [
                *prefix,
                *(sys.executable, "-m", "deltastream", "serve", "--config", str(config)),
                *("--http", f"127.0.0.1:{self.port}", "--log-summary-every", "0"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=log.open("w"),
            start_new_session=True,  # end() kills a wrapper's (unshare's) child with it
            cwd=code,
            env=None if code is None else {**os.environ, "PYTHONPATH": str(code)},
        )

    def owned(self) -> set[str] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=5) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            body = json.load(e)
        except OSError:
            return None
        return {t["name"] for t in body["tables"] if t["owned"]}

    def following(self) -> int:
        """How many streams this replica runs that are past their start-up."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=30) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            body = json.load(e)
        except OSError:
            return 0
        return sum(1 for t in body["tables"] if t["owned"] and t["status"] == "following")

    def metric(self, name: str, label: str = "") -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + "{") and label in line:
                    return float(line.rsplit(" ", 1)[1])
        raise SystemExit(f"no {name} in /metrics")

    def shares(self) -> tuple[float, float] | None:
        """The shards this replica holds and its share of them (``None`` while it has not
        joined, or does not answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30) as r:
                lines = r.read().decode().splitlines()
        except OSError:
            return None
        values = {
            line.split("{", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in lines
            if line.startswith("deltastream_replica_shards_")
        }
        try:
            return (
                values["deltastream_replica_shards_owned"],
                values["deltastream_replica_shards_quota"],
            )
        except KeyError:
            return None

    def end(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def wait_for(check, timeout: float) -> float:  # type: ignore[no-untyped-def]
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise SystemExit("timed out")
        time.sleep(0.02)
    return time.monotonic() - start


def config_text(
    root: Path, streams: int, table_of: str, ttl: float, group: str = "", options: str = ""
) -> str:
    """``group``: the lease directory, when not the default beside the local states."""
    lines = ["[server]", f"lease_ttl = {ttl}", "rebalance_delay = 2", "log_summary_interval = 0"]
    if group:
        lines += [f'group = "{group}"', f"group_storage_options = {options}"]
    lines += [
        "[defaults]",
        f'state_dir = "{root / "state"}"',
        "poll_interval = 5",
        'mode = "follow"',
    ]
    for i in range(streams):
        lines += [
            "[[tables]]",
            f'name = "s{i}"',
            f'uri = "{table_of.format(i=i)}"',
            f'sink = "jsonl:{root / "out" / f"s{i}.jsonl"}"',
        ]
    return "\n".join(lines) + "\n"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def takeover(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-replicas-"))
    (root / "out").mkdir()
    tables = 8
    for i in range(tables):
        write_deltalake(root / f"t{i}", pa.table({"id": [i]}), mode="append")
    config = root / "c.toml"
    config.write_text(config_text(root, tables, str(root / "t{i}"), args.lease_ttl))
    names = {f"s{i}" for i in range(tables)}
    results: dict[str, list[float]] = {"kill -9": [], "node loss (SIGSTOP)": []}
    survivor = Replica(config, root / "r0.log")
    wait_for(lambda: survivor.owned() == names, 60)
    serial = 1
    for round_ in range(args.kills):
        kind = "kill -9" if round_ % 2 == 0 else "node loss (SIGSTOP)"
        victim = Replica(config, root / f"r{serial}.log")
        serial += 1
        # The newcomer gets its share, then dies with it.
        wait_for(
            lambda v=victim: bool(v.owned()) and len(survivor.owned() or ()) < tables,  # type: ignore[misc]
            60,
        )
        # Settled: no shard changing hands (a local writer frozen inside a shard's write
        # would hold that shard's lock until it thaws, which a lost node never does here).
        time.sleep(1.5)
        if kind == "kill -9":
            victim.process.kill()
        else:
            victim.process.send_signal(signal.SIGSTOP)
        seconds = wait_for(lambda: survivor.owned() == names, 4 * args.lease_ttl + 30)
        results[kind].append(seconds)
        print(f"round {round_ + 1}: {kind}: {seconds:.2f} s", file=sys.stderr)
        victim.end()
    survivor.end()
    print(f"take-over, {tables} tables, lease_ttl {args.lease_ttl:g} s, local state:")
    for kind, values in results.items():
        if values:
            print(
                f"  {kind:20s} n={len(values):2d}  p50 {statistics.median(values):6.2f} s  "
                f"p99 {percentile(values, 0.99):6.2f} s  max {max(values):6.2f} s"
            )


def traffic(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-replicas-"))
    (root / "out").mkdir()
    write_deltalake(root / "t", pa.table({"id": [0]}), mode="append")
    server = None
    options = ""
    group = ""
    if args.store == "s3":
        server, _, options = start_moto()
        # The leases on S3; the streams' states stay local (where they are changes nothing
        # of the lease traffic, and 10,000 states on moto take half an hour to start).
        group = "s3://bench/_replicas"
    config = root / "c.toml"
    config.write_text(config_text(root, args.streams, str(root / "t"), 15, group, options))
    replicas = [Replica(config, root / f"r{i}.log") for i in range(2)]
    names = {f"s{i}" for i in range(args.streams)}
    started = time.monotonic()
    wait_for(
        lambda: (
            set().union(*[r.owned() or set() for r in replicas]) == names
            and all(r.owned() for r in replicas)
        ),
        3600,
    )
    # Measured in the steady state: every stream past its start-up.
    wait_for(lambda: sum(r.following() for r in replicas) == args.streams, 3600)
    print(
        f"{args.streams} streams following on 2 replicas after {time.monotonic() - started:.0f} s",
        file=sys.stderr,
    )
    before = [r.metric("deltastream_lease_requests_total") for r in replicas]
    time.sleep(args.seconds)
    after = [r.metric("deltastream_lease_requests_total") for r in replicas]
    for r in replicas:
        r.end()
    if server is not None:
        server.stop()
    rates = [(b - a) / args.seconds for a, b in zip(before, after, strict=True)]
    print(
        f"lease requests per second per replica, {args.streams} streams, leases on "
        f"{args.store}, over {args.seconds:g} s: " + ", ".join(f"{rate:.2f}" for rate in rates)
    )


def steady(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-replicas-"))
    (root / "out").mkdir()
    tables = 6
    for i in range(tables):
        write_deltalake(root / f"t{i}", pa.table({"id": [i]}), mode="append")
    config = root / "c.toml"
    text = config_text(root, tables, str(root / "t{i}"), 3).replace(
        "rebalance_delay = 2", "rebalance_delay = 1\nshards = 8"
    )
    config.write_text(text)
    names = {f"s{i}" for i in range(tables)}
    boot_id = root / "other.boot_id"
    boot_id.write_text("other-host-0000-0000-0000-000000000000\n")
    own_ns = ("unshare", "--pid", "--fork", "--mount-proc")
    script = (
        'hostname "$1" && mount --bind "$2" /proc/sys/kernel/random/boot_id && shift 2 && exec "$@"'
    )
    elsewhere = (
        *("unshare", "--uts", "--mount", "--pid", "--fork", "--mount-proc"),
        *("sh", "-c", script, "sh", "other-host", str(boot_id)),
    )
    group = [
        Replica(config, root / "a.log", own_ns),
        Replica(config, root / "b.log", own_ns),
        Replica(config, root / "c.log", elsewhere),
    ]

    def balanced() -> bool:
        owned = [r.owned() or set() for r in group]
        return set().union(*owned) == names and all(owned)

    wait_for(balanced, 60)
    time.sleep(3)  # the rebalance delay and its moves
    acquired = 'transition="acquired"'
    before = [r.metric("deltastream_lease_transitions_total", acquired) for r in group]
    lost_before = [
        r.metric("deltastream_lease_transitions_total", 'transition="lost"') for r in group
    ]
    polls = overlaps = 0
    start = time.monotonic()
    while time.monotonic() - start < args.seconds:
        owned = [r.owned() or set() for r in group]
        seen = [s for o in owned for s in o]
        polls += 1
        overlaps += len(seen) != len(set(seen))
        time.sleep(0.2)
    taken = [
        r.metric("deltastream_lease_transitions_total", acquired) - b
        for r, b in zip(group, before, strict=True)
    ]
    lost = [
        r.metric("deltastream_lease_transitions_total", 'transition="lost"') - b
        for r, b in zip(group, lost_before, strict=True)
    ]
    print(
        f"steady, {tables} tables, 8 shards, lease_ttl 3 s, {args.seconds:g} s: replicas in "
        "their own pid namespaces (2 sharing this host's name, 1 as another host): shards "
        f"taken {[int(t) for t in taken]}, lost {[int(x) for x in lost]}, a stream on two "
        f"replicas in {overlaps} of {polls} /healthz polls"
    )


def start_moto() -> tuple[Any, str, str]:
    """moto's S3 server with a bucket ``bench``: the server, its endpoint, and storage
    options for a TOML table."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's access log
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    ).create_bucket(Bucket="bench")
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    options = (
        f'{{ endpoint_url = "{endpoint}", aws_access_key_id = "testing", '
        'aws_secret_access_key = "testing", region = "us-east-1" }'
    )
    return server, endpoint, options


def start_emulator(store: str, stack: contextlib.ExitStack) -> tuple[str, str, str]:
    """A bucket (or container) ``bench`` on ``store``'s emulator, started as the tests start
    it (stopped with ``stack``): its endpoint, storage options for a TOML table, and the URI
    scheme and bucket of ``state_dir``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: emulators
    if store == "s3":
        server, endpoint, options = start_moto()
        stack.callback(server.stop)
        return endpoint, options, "s3://bench"
    if store == "azure":
        from azure.storage.blob import ContainerClient
        from emulators import azurite, azurite_connection_string

        endpoint = stack.enter_context(azurite())
        connection = azurite_connection_string(endpoint)
        with ContainerClient.from_connection_string(connection, "bench") as client:
            client.create_container()
        options = f'{{ endpoint_url = "{endpoint}", azure_storage_use_emulator = "true" }}'
        return endpoint, options, "az://bench"
    from emulators import gcs_create_bucket, gcs_emulator

    endpoint = stack.enter_context(gcs_emulator())
    gcs_create_bucket(endpoint, "bench")
    return endpoint, f'{{ endpoint_url = "{endpoint}" }}', "gs://bench"


def put_latency(root: str, options: str) -> float:
    """The median milliseconds of a small PUT to the store at ``root`` through deltastream's
    store (its latency as the replicas see it: a new connection's handshake excluded)."""
    import tomllib

    from deltastream.storage import open_store

    parsed = tomllib.loads(f"o = {options}")["o"]

    async def measure() -> float:
        async with open_store(root, parsed) as store:
            await store.put("probe", b"{}")
            times = []
            for _ in range(30):
                start = time.perf_counter()
                await store.put("probe", b"{}")
                times.append((time.perf_counter() - start) * 1000)
            await store.delete("probe")
        return statistics.median(times)

    return anyio.run(measure)


class HandoverGroup:
    """Two replicas of one configuration (states and leases on S3) for :func:`handover`,
    running deltastream from ``code`` (``None``: this checkout)."""

    def __init__(
        self,
        label: str,
        root: Path,
        tables: int,
        options: str,
        state_root: str,
        args: argparse.Namespace,
        code: Path | None,
    ) -> None:
        self.label, self.root, self.code = label, root / label, code
        (self.root / "out").mkdir(parents=True)
        lines = [
            "[server]",
            f"lease_ttl = {args.lease_ttl}",
            "rebalance_delay = 2",
            "log_summary_interval = 0",
            "[defaults]",
            f'state_dir = "{state_root}/{label}/state"',
            f"state_storage_options = {options}",
            "poll_interval = 0.1",
            'mode = "follow"',
        ]
        for i in range(tables):
            lines += [
                "[[tables]]",
                f'name = "s{i}"',
                f'uri = "{root / f"t{i}"}"',
                f'sink = "jsonl:{self.root / "out" / f"s{i}.jsonl"}"',
            ]
        self.config = self.root / "c.toml"
        self.config.write_text("\n".join(lines) + "\n")
        self.names = {f"s{i}" for i in range(tables)}
        self.serial = 0
        self.replicas = [self.start(), self.start()]
        self.owned: list[float] = []
        self.following: list[float] = []
        self.exited: list[float] = []
        self.joined: list[float] = []

    def start(self) -> Replica:
        self.serial += 1
        return Replica(self.config, self.root / f"r{self.serial}.log", code=self.code)

    def balanced(self) -> bool:
        """Every stream owned and every replica holding its share of the shards (with 8
        streams in 64 shards, a replica's share may hold none of them)."""
        owned = [r.owned() for r in self.replicas]
        if set().union(*(o or set() for o in owned)) != self.names or None in owned:
            return False
        shares = [r.shares() for r in self.replicas]
        # (A share of 0: the replica has not listed the group yet.)
        return all(share is not None and share[0] == share[1] > 0 for share in shares)

    def round(self) -> None:
        wait_for(self.balanced, 120)
        time.sleep(3)  # the rebalance delay, and its moves done
        victim, survivor = self.replicas
        sigterm = time.monotonic()
        victim.process.send_signal(signal.SIGTERM)
        owned = wait_for(lambda: survivor.owned() == self.names, 60)
        following = wait_for(lambda: survivor.following() == len(self.names), 60)
        victim.process.wait(timeout=60)
        self.exited.append(time.monotonic() - sigterm)  # (polled: an upper bound)
        self.owned.append(owned)
        self.following.append(owned + following)
        print(
            f"{self.label}: round {len(self.owned)}: owned {owned:.2f} s, following "
            f"{owned + following:.2f} s, releasing replica exited by {self.exited[-1]:.2f} s",
            file=sys.stderr,
        )
        self.replicas = [survivor, self.start()]
        # The join: from the newcomer's /healthz first answering until the group is balanced
        # and every stream delivers again (the rebalance_delay of 2 s included).
        newcomer = self.replicas[1]
        wait_for(lambda: newcomer.owned() is not None, 60)
        joined = wait_for(
            lambda: (
                self.balanced() and sum(r.following() for r in self.replicas) == len(self.names)
            ),
            120,
        )
        self.joined.append(joined)
        print(f"{self.label}: round {len(self.owned)}: joined {joined:.2f} s", file=sys.stderr)


def handover(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-replicas-"))
    for i in range(args.tables):
        write_deltalake(root / f"t{i}", pa.table({"id": [i]}), mode="append")
    stack = contextlib.ExitStack()
    endpoint, options, state_root = start_emulator(args.store, stack)
    if args.latency:
        # Every request of the replicas delayed as a real store's round trip is (an
        # emulator's own is a few ms on one machine): tests/faultproxy.py's "delay" on all.
        from faultproxy import FaultProxy

        low, high = (float(x) / 1000 for x in args.latency.split(","))
        host = endpoint.split("/", 3)[:3]  # Azurite's endpoint carries the account's path
        proxy = FaultProxy(
            "/".join(host), rate=1.0, weights={"delay": 1.0}, delay_range=(low, high)
        )
        stack.enter_context(proxy)
        options = options.replace("/".join(host), proxy.url)
    put_ms = put_latency(state_root, options)
    variants: list[tuple[str, Path | None]] = []
    if args.compare:
        code = root / "before"
        code.mkdir()
        archive = subprocess.run(
            ["git", "archive", args.compare, "deltastream"],
            cwd=Path(__file__).resolve().parents[2],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(code)], input=archive, check=True)
        variants.append((f"before ({args.compare})", code))
    variants.append(("after" if args.compare else "this checkout", None))
    groups = [
        HandoverGroup(f"g{n}", root, args.tables, options, state_root, args, code)
        for n, (_, code) in enumerate(variants)
    ]
    with stack:
        for _ in range(args.rounds):
            for group in groups:
                group.round()
        for r in Replica.started:
            r.end()
    emulator = {"s3": "S3 (moto)", "azure": "Azure (Azurite)", "gcs": "GCS (the emulator)"}
    print(
        f"SIGTERM hand-over, {args.tables} tables, 64 shards, lease_ttl {args.lease_ttl:g} s, "
        f"states and leases on {emulator[args.store]}, PUT p50 {put_ms:.0f} ms, "
        f"{args.rounds} rounds:"
    )
    for (label, _), group in zip(variants, groups, strict=True):
        for what, values in (
            ("survivor owns every stream", group.owned),
            ("every stream following", group.following),
            ("joined: balanced, following", group.joined),
        ):
            print(
                f"  {label:22s} {what:28s} p50 {statistics.median(values):5.2f} s  "
                f"p99 {percentile(values, 0.99):5.2f} s  max {max(values):5.2f} s"
            )


def requests(args: argparse.Namespace) -> None:
    import tomllib

    from deltastream.storage import open_store

    with contextlib.ExitStack() as stack:
        endpoint, options, root = start_emulator(args.store, stack)
        from faultproxy import FaultProxy  # (tests/, on the path since start_emulator)

        host = "/".join(endpoint.split("/", 3)[:3])  # Azurite's carries the account's path
        proxy = FaultProxy(host, rate=1.0, weights={"delay": 1.0}, delay_range=(0.02, 0.05))
        stack.enter_context(proxy)
        parsed = tomllib.loads(f"o = {options.replace(host, proxy.url)}")["o"]

        async def measure() -> dict[str, float]:
            async with open_store(f"{root}/requests", parsed) as store:
                for i in range(16):
                    await store.put(f"k{i}", b'{"owner": ""}')

                async def at_once(call: Any) -> None:
                    async with anyio.create_task_group() as tg:
                        for i in range(16):
                            tg.start_soon(call, f"k{i}")

                async def listing() -> None:
                    _ = [meta async for meta in store.list_from("")]

                calls = {
                    "PUT": lambda: store.put("k0", b"{}"),
                    "tagged read": lambda: store.get_tagged("k0"),
                    "GET": lambda: store.get("k0"),
                    "LIST": listing,
                    "16 tagged reads at once": lambda: at_once(store.get_tagged),
                    "16 PUTs at once": lambda: at_once(lambda k: store.put(k, b"{}")),
                }
                medians = {}
                for name, call in calls.items():
                    times = []
                    for _ in range(15):
                        start = time.perf_counter()
                        await call()
                        times.append((time.perf_counter() - start) * 1000)
                    medians[name] = statistics.median(times)
                return medians

        medians = anyio.run(measure)
    print(
        f"{args.store}, each request delayed 20-50 ms, medians of 15: "
        + ", ".join(f"{name} {ms:.0f} ms" for name, ms in medians.items())
    )


def _end_children() -> None:
    """Kill the replicas a run started, however it ends (an error, Ctrl-C)."""
    for replica in Replica.started:
        replica.end()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    t = sub.add_parser("takeover")
    t.add_argument("--kills", type=int, default=20)
    t.add_argument("--lease-ttl", type=float, default=15)
    r = sub.add_parser("traffic")
    r.add_argument("--streams", type=int, default=10_000)
    r.add_argument("--store", choices=("local", "s3"), default="local")
    r.add_argument("--seconds", type=float, default=60)
    s = sub.add_parser("steady")
    s.add_argument("--seconds", type=float, default=60)
    h = sub.add_parser("handover")
    h.add_argument("--rounds", type=int, default=10)
    h.add_argument("--tables", type=int, default=8)
    h.add_argument("--lease-ttl", type=float, default=15)
    h.add_argument("--compare", metavar="REV", help="also run git revision REV, side by side")
    h.add_argument(
        "--latency",
        metavar="MIN_MS,MAX_MS",
        help="delay every request to the store by MIN_MS..MAX_MS (e.g. 20,50: a real round trip)",
    )
    h.add_argument("--store", choices=("s3", "azure", "gcs"), default="s3")
    q = sub.add_parser("requests")
    q.add_argument("--store", choices=("s3", "azure", "gcs"), default="gcs")
    args = parser.parse_args()
    commands = {
        "takeover": takeover,
        "traffic": traffic,
        "steady": steady,
        "handover": handover,
        "requests": requests,
    }
    try:
        commands[args.what](args)
    finally:
        _end_children()


if __name__ == "__main__":
    main()
