"""deploy/ agrees with the CLI and the configuration format it drives.

Every file is parsed for real (the Dockerfile by a small instruction reader, YAML by pyyaml,
TOML by the daemon's own loader, the systemd unit by a small INI reader) and every
``deltastream`` command line goes through the CLI's argument parser. Nothing is built:
Docker does not run where these files were written. The Prometheus alert rules go through
``promtool check rules`` and their unit tests, and with the Grafana dashboard's queries into
a real Prometheus server scraping a running daemon (Debian's ``prometheus`` package).
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import aiohttp
import anyio
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import S3Server, free_port
from deltalake import DeltaTable, write_deltalake
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from prometheus_server import families, promtool, run_prometheus, series, until

from deltastream.changes.api import read_changes
from deltastream.cli import _build_parser
from deltastream.daemon.service.config import load_config, parse_config
from deltastream.daemon.service.server import parse_address
from deltastream.daemon.service.supervisor import Service, ServiceConfig, StreamConfig
from deltastream.daemon.sinks import JsonlSink, ParquetSink, parse_sink
from deltastream.daemon.stream.config import Mode, StartFrom, TailConfig
from deltastream.storage.s3 import S3Options

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = DEPLOY / "Dockerfile.dockerignore"
COMPOSE = DEPLOY / "docker-compose.yml"
CONFIG = DEPLOY / "config" / "deltastream.toml"
K8S = DEPLOY / "kubernetes"
UNIT = DEPLOY / "systemd" / "deltastream.service"
WRITER = DEPLOY / "writer" / "write_demo_tables.py"
CONSTRAINTS = DEPLOY / "constraints.txt"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
ALERTS_TEST = DEPLOY / "prometheus" / "alerts_test.yml"
DASHBOARD = DEPLOY / "grafana" / "deltastream.json"

#: The daemon's default grace period, when a config does not set one.
DEFAULT_GRACE = 8.0


# --- readers -------------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (KEYWORD, arguments), continuations joined and
    comment lines dropped (also inside a continued instruction, as Docker does)."""
    instructions: list[tuple[str, str]] = []
    current = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        keyword, _, rest = (current + stripped).partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        current = ""
    assert not current, "the Dockerfile ends inside a continued instruction"
    return instructions


def final_stage() -> list[tuple[str, str]]:
    instructions = dockerfile()
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def only(instructions: Sequence[tuple[str, str]], keyword: str) -> str:
    found = [rest for kw, rest in instructions if kw == keyword]
    assert len(found) == 1, f"expected one {keyword} in the final stage, found {found}"
    return found[0]


def exec_form(text: str) -> list[str]:
    value = json.loads(text)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), text
    return value


#: The init the image runs as PID 1, in front of the daemon (it reaps exec: sinks' orphans).
IMAGE_INIT = ["/usr/bin/tini", "--"]


def image_entrypoint() -> list[str]:
    """The image's ENTRYPOINT after its init: what the init runs (the daemon's command)."""
    entrypoint = exec_form(only(final_stage(), "ENTRYPOINT"))
    assert entrypoint[: len(IMAGE_INIT)] == IMAGE_INIT, f"no init in front: {entrypoint}"
    return entrypoint[len(IMAGE_INIT) :]


def image_uid() -> int:
    """The numeric uid the image runs as (its USER, resolved through its useradd)."""
    user = [rest for kw, rest in final_stage() if kw == "USER"][-1].split(":")[0]
    if user.isdigit():
        return int(user)
    useradd = rf"useradd\b[^&;]*--uid (\d+)[^&;]*\b{re.escape(user)}\b"
    match = re.search(useradd, DOCKERFILE.read_text())
    assert match, f"USER {user}: no useradd --uid for it in the Dockerfile"
    return int(match.group(1))


def compose() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(document, dict)
    return document


def service(name: str) -> dict[str, Any]:
    services = compose()["services"]
    assert name in services, f"docker-compose.yml has no service {name!r}"
    return dict(services[name])


def compose_replicas() -> dict[str, dict[str, Any]]:
    """The compose services that run the daemon: built from the Dockerfile, with its
    ENTRYPOINT (the demo writer, built from it too, replaces it)."""
    return {
        name: dict(svc)
        for name, svc in compose()["services"].items()
        if "build" in svc
        and (COMPOSE.parent / svc["build"]["context"] / svc["build"]["dockerfile"]).resolve()
        == DOCKERFILE
        and "entrypoint" not in svc
    }


def k8s_objects(kind: str) -> list[dict[str, Any]]:
    """Every object of ``kind`` in deploy/kubernetes/."""
    return [
        dict(doc)
        for path in sorted(K8S.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == kind
    ]


def k8s(kind: str, name: str | None = None) -> dict[str, Any]:
    """The one object of ``kind`` (named ``name``, if given) in deploy/kubernetes/."""
    found = [o for o in k8s_objects(kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''} in {K8S}, found {len(found)}"
    return found[0]


def pod_spec() -> dict[str, Any]:
    """The Deployment's pod."""
    return dict(k8s("Deployment")["spec"]["template"]["spec"])


def cron_pod_spec() -> dict[str, Any]:
    """The CronJob's pod."""
    return dict(k8s("CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"])


def container(pod: Mapping[str, Any] | None = None) -> dict[str, Any]:
    containers = (pod or pod_spec())["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def configmap_toml(name: str = "deltastream-config") -> dict[str, Any]:
    return tomllib.loads(k8s("ConfigMap", name)["data"]["deltastream.toml"])


def mounted_config(pod: Mapping[str, Any]) -> tuple[Any, ServiceConfig]:
    """A pod's command line, parsed by the CLI, and the configuration its ``--config`` names,
    read from the ConfigMap mounted there (read-only)."""
    spec = container(pod)
    entry = spec.get("command") or image_entrypoint()
    args = parse_cli(list(entry) + list(spec["args"]))
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounted: dict[str, str] = {}
    for mount in spec["volumeMounts"]:
        source = volumes[mount["name"]].get("configMap")
        if source:
            data = k8s("ConfigMap", source["name"])["data"]
            keys = {i["key"]: i["path"] for i in source.get("items", [])} or {k: k for k in data}
            for path in keys.values():
                mounted[str(PurePosixPath(mount["mountPath"], path))] = source["name"]
            assert mount.get("readOnly")
    assert args.config in mounted, f"{args.config} is not mounted from a ConfigMap"
    name = mounted[args.config]
    return args, parse_config(configmap_toml(name), f"ConfigMap {name}")


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a label selector (``matchLabels`` only: the files use no expressions) picks a
    pod with ``labels``."""
    assert set(selector) <= {"matchLabels"}, selector
    return bool(selector["matchLabels"]) and selector["matchLabels"].items() <= labels.items()


def stop_bound(config: ServiceConfig) -> float:
    """The longest a clean stop (SIGTERM) of ``config`` takes: the streams get
    ``shutdown_grace`` to reach a delivery boundary; a replica then leaves its group with
    three lease requests, each abandoned after ``request_timeout`` (the heartbeat marked
    leaving, the shards released, the heartbeat deleted: ``Coordinator.leave``)."""
    group = config.group
    return config.shutdown_grace + (3 * group.request_timeout if group is not None else 0.0)


def in_object_store(location: str) -> bool:
    return re.match(r"(s3|az|abfss|gs)://", location) is not None


def unit() -> dict[str, dict[str, list[str]]]:
    """The systemd unit: section -> key -> values (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        assert current is not None, f"{UNIT}: {line!r} outside a section"
        key, sep, value = line.partition("=")
        assert sep, f"{UNIT}: not KEY=VALUE: {line!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def unit_value(section: str, key: str) -> str:
    values = unit()[section].get(key)
    assert values, f"{UNIT}: no {key}= in [{section}]"
    return values[-1]


_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600}


def seconds(text: str | int | float) -> float:
    """A duration as compose ("1m30s") or systemd ("1min 30s", "90") write it."""
    if isinstance(text, int | float):
        return float(text)
    text = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]+)", text)
    assert parts and re.sub(r"[\d.\sa-z]", "", text) == "", f"not a duration: {text!r}"
    return sum(float(n) * _UNITS[unit] for n, unit in parts)


def parse_cli(argv: Sequence[str]) -> Any:
    """``argv`` (program name first) parsed by the real CLI parser."""
    assert PurePosixPath(argv[0]).name == "deltastream", f"not a deltastream command: {argv}"
    try:
        return _build_parser().parse_args(list(argv[1:]))
    except SystemExit:
        pytest.fail(f"the CLI rejects {shlex.join(argv)}")


def http_address(config: ServiceConfig, args: Any) -> tuple[str, int]:
    """Where the daemon listens: ``--http`` if given, else the config's [server] http."""
    address = args.http if args.http is not None else config.http_address
    assert address, "the HTTP server is off: no /healthz for probes"
    return parse_address(address)


def local_paths(config: ServiceConfig) -> Iterator[PurePosixPath]:
    """Every local path the daemon writes to: state directories, sink files, work_dir."""
    if config.work_dir:
        yield PurePosixPath(config.work_dir)
    for stream in config.streams:
        if "://" not in stream.tail.state:
            yield PurePosixPath(stream.tail.state)
        sink = parse_sink(stream.sink, table=stream.tail.name)
        if isinstance(sink, JsonlSink) and sink.path is not None:
            yield PurePosixPath(sink.path)
        elif isinstance(sink, ParquetSink):
            yield PurePosixPath(sink.directory)


def under(path: PurePosixPath, directory: str) -> bool:
    return path == PurePosixPath(directory) or PurePosixPath(directory) in path.parents


def compose_mounts(svc: Mapping[str, Any]) -> list[tuple[str, str, bool]]:
    """A compose service's volumes as (source, target, read_only)."""
    mounts = []
    for volume in svc.get("volumes", []):
        if isinstance(volume, str):
            source, target, *mode = volume.split(":")
            mounts.append((source, target, "ro" in mode[0].split(",") if mode else False))
        else:
            mounts.append(
                (volume.get("source", ""), volume["target"], bool(volume.get("read_only")))
            )
    return mounts


def compose_ports(svc: Mapping[str, Any]) -> list[tuple[str, int, int]]:
    """A compose service's published ports as (host_ip, published, container_port)."""
    ports = []
    for port in svc.get("ports", []):
        if isinstance(port, str):
            parts = port.split("/")[0].split(":")
            assert len(parts) == 3, f"publish on an explicit host address: {port!r}"
            ports.append((parts[0], int(parts[1]), int(parts[2])))
        else:
            ports.append((port["host_ip"], int(port["published"]), int(port["target"])))
    return ports


def container_port(spec: Mapping[str, Any], port: int | str) -> int:
    """A probe's or Service's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in spec.get("ports", []) if "name" in p}
    assert port in named, f"port name {port!r} is not one of the container's {sorted(named)}"
    return int(named[port])


# --- the configurations ---------------------------------------------------------------------

CONFIGS = {
    "config/deltastream.toml": lambda: load_config(CONFIG),
    "kubernetes/configmap.yaml": lambda: parse_config(configmap_toml(), "configmap.yaml"),
}
#: With the CronJob's, which runs no HTTP server.
ALL_CONFIGS = {
    **CONFIGS,
    "kubernetes/cronjob.yaml": lambda: mounted_config(cron_pod_spec())[1],
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_container_configs_load_and_listen_on_every_interface(name: str) -> None:
    config = CONFIGS[name]()
    assert config.streams
    assert config.http_address is not None
    assert parse_address(config.http_address) == ("0.0.0.0", 9464)


@pytest.mark.parametrize("name", sorted(ALL_CONFIGS))
def test_storage_options_are_accepted_and_hold_no_credentials(name: str) -> None:
    config = ALL_CONFIGS[name]()
    every = [s.tail.storage_options for s in config.streams]
    every += [s.tail.state_storage_options for s in config.streams]
    every += [config.group.storage_options] if config.group is not None else []
    for options in every:
        if options is None:
            continue
        parsed = S3Options.from_storage_options(options)
        # Credentials come from the environment (compose, a Secret, an EnvironmentFile).
        assert parsed.access_key_id is None and parsed.secret_access_key is None


@pytest.mark.parametrize("name", sorted(ALL_CONFIGS))
def test_container_configs_form_a_replica_group_in_the_object_store(name: str) -> None:
    """Replicas in separate containers (or a job's pod, gone after each run) share nothing
    but the object store: every stream's state and the group's leases are there."""
    config = ALL_CONFIGS[name]()
    assert config.group is not None, "no replica group: [defaults] state_dir is not set"
    assert in_object_store(config.group.uri), config.group.uri
    for stream in config.streams:
        assert in_object_store(stream.tail.state), stream.tail.state
        # The leases are in the store the states are in (MinIO's endpoint, for compose).
        assert stream.tail.resolved_state_options == config.group.storage_options
    # Each stream's state is its own (the group checks that none is its lease directory).
    states = [s.tail.state for s in config.streams]
    assert len(set(states)) == len(states)


# --- Dockerfile -------------------------------------------------------------------------------


def test_dockerfile_command_line_parses() -> None:
    argv = image_entrypoint() + exec_form(only(final_stage(), "CMD"))
    args = parse_cli(argv)
    assert args.command == "serve"
    assert args.config == "/etc/deltastream/deltastream.toml"
    assert args.http is None  # the config's [server] http applies


#: A slim Python image pinned to an exact Python and Debian release (and maybe a digest).
PINNED_BASE = r"python:(\d+)\.(\d+)\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?"


def test_dockerfile_uses_a_slim_python_that_the_package_supports() -> None:
    instructions = dockerfile()
    defaults = dict(rest.split("=", 1) for kw, rest in instructions if kw == "ARG" and "=" in rest)
    minimum = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert minimum.startswith(">=")
    floor = tuple(int(n) for n in minimum[2:].split("."))
    bases = [rest.split()[0] for kw, rest in instructions if kw == "FROM"]
    assert bases
    for base in bases:
        resolved = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], base)
        match = re.fullmatch(PINNED_BASE, resolved)
        assert match, f"not a slim Python base image: {base} ({resolved})"
        assert (int(match.group(1)), int(match.group(2))) >= floor


def test_dockerfile_installs_the_package_from_the_build_context() -> None:
    instructions = dockerfile()
    workdir = "/"
    copied: dict[str, str] = {}
    installed_from: list[str] = []
    pips: list[str] = []
    for keyword, rest in instructions:
        if keyword == "WORKDIR":
            workdir = rest
        elif keyword == "COPY" and not rest.startswith("--from"):
            *sources, target = rest.split()
            into = len(sources) > 1 or target.endswith("/") or target == "."
            for source in sources:
                assert (ROOT / source).exists(), f"COPY {source}: not in the build context"
                dest = PurePosixPath(workdir, target)
                copied[source] = str(dest / source if into else dest)
        elif keyword == "RUN":
            for match in re.finditer(r"(\S*pip) install\s+(?:-\S+\s+)*\"?([^\s\"]+)", rest):
                pips.append(match.group(1))
                installed_from.append(re.sub(r"\$\{[^}]*\}", "", match.group(2)))
    assert installed_from, "no pip install in the Dockerfile"
    # The package's sources were copied to the directory pip installs.
    target = PurePosixPath(installed_from[0])
    assert PurePosixPath(copied["pyproject.toml"]).parent == target
    assert PurePosixPath(copied["deltastream"]) == target / "deltastream"
    # The readme is part of the package metadata: the build needs it.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert PurePosixPath(copied[project["readme"]]).parent == target
    # So are the license files (the build fails without them).
    for licence in project["license-files"]:
        assert PurePosixPath(copied[licence]).parent == target
    # The runtime stage has the environment pip installed into, and its scripts on PATH.
    bin_dir = str(PurePosixPath(pips[0]).parent)
    venv = str(PurePosixPath(bin_dir).parent)
    final = final_stage()
    assert any(kw == "COPY" and rest.startswith("--from") and venv in rest for kw, rest in final)
    path = re.search(r"PATH=(\S+)", " ".join(rest for kw, rest in final if kw == "ENV"))
    assert path and bin_dir in path.group(1).split(":")
    assert image_entrypoint() == ["deltastream"]


def test_dockerfile_runs_as_non_root() -> None:
    final = final_stage()
    users = [i for i, (kw, _) in enumerate(final) if kw == "USER"]
    assert users, "the image runs as root"
    assert image_uid() != 0
    assert final[users[-1]][1].split(":")[0] not in ("root", "0")
    # Nothing after the last USER switches back.
    entry = max(i for i, (kw, _) in enumerate(final) if kw in ("ENTRYPOINT", "CMD"))
    assert users[-1] < entry


def test_dockerfile_port_healthcheck_signal_and_volume() -> None:
    final = final_stage()
    config = load_config(CONFIG)
    _, port = parse_address(config.http_address or "")
    assert only(final, "EXPOSE").split() == [str(port)]
    assert only(final, "STOPSIGNAL") == "SIGTERM"
    healthcheck = only(final, "HEALTHCHECK")
    options, sep, command = healthcheck.partition("CMD ")
    assert sep and "--interval" in options
    argv = exec_form(command)
    assert argv[0] == "python", "slim images have no curl: check with Python's stdlib"
    url = re.search(r"http://([^/'\"]+)(/[^'\"]*)", argv[-1])
    assert url, f"no URL in the HEALTHCHECK: {argv}"
    host, health_port = parse_address(url.group(1))
    assert (host, health_port, url.group(2)) == ("127.0.0.1", port, "/healthz")
    volumes = exec_form(only(final, "VOLUME"))
    for path in local_paths(config):
        assert any(under(path, v) for v in volumes), f"{path} is not on the image's VOLUME"


def _ignored(path: str, patterns: Sequence[str]) -> bool:
    """Whether a .dockerignore excludes ``path`` (the last matching pattern wins)."""
    ignored = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        prefixes = [str(PurePosixPath(*PurePosixPath(path).parts[:n])) for n in range(1, 9)]
        if any(fnmatch.fnmatch(p, pattern) for p in prefixes):
            ignored = not negated
    return ignored


def test_dockerignore_keeps_what_the_dockerfile_copies() -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    for keyword, rest in dockerfile():
        if keyword == "COPY" and not rest.startswith("--from"):
            for source in rest.split()[:-1]:
                assert not _ignored(source, patterns), f"COPY {source}: excluded"
    assert _ignored(".git", patterns)
    assert _ignored("deltastream/__pycache__/cli.cpython-312.pyc", patterns)


def test_dockerfile_pins_one_base_image_for_both_stages() -> None:
    """The same exact base in the build and runtime stages (the venv's interpreter symlinks
    point into it), pinned to a Python patch release and a Debian release."""
    instructions = dockerfile()
    bases = {rest.split()[0] for kw, rest in instructions if kw == "FROM"}
    assert len(bases) == 1, bases
    (version,) = [rest for kw, rest in instructions if kw == "ARG" and "PYTHON_VERSION=" in rest]
    assert re.fullmatch(r"PYTHON_VERSION=\d+\.\d+\.\d+", version), version
    # deploy/constraints.txt is generated for the image's Python: its header says which.
    assert f"Python {version.split('=')[1]} " in CONSTRAINTS.read_text()


def test_dockerfile_runs_tini_as_pid_1() -> None:
    final = final_stage()
    entrypoint = exec_form(only(final, "ENTRYPOINT"))
    assert entrypoint[: len(IMAGE_INIT)] == IMAGE_INIT
    # No -g: SIGTERM goes to the daemon alone, so that an exec: sink's command can finish.
    assert "-g" not in entrypoint
    installs = " ".join(rest for kw, rest in final if kw == "RUN")
    assert re.search(r"apt-get install -y --no-install-recommends (\S+ )*tini\b", installs)
    assert "rm -rf /var/lib/apt/lists/*" in installs
    # Installed before the switch to the unprivileged user (apt needs root).
    first_user = min(i for i, (kw, _) in enumerate(final) if kw == "USER")
    tini_run = min(i for i, (kw, rest) in enumerate(final) if kw == "RUN" and "tini" in rest)
    assert tini_run < first_user


def test_dockerfile_installs_with_the_constraints_file() -> None:
    instructions = dockerfile()
    copies = [rest.split() for kw, rest in instructions if kw == "COPY" and "--from" not in rest]
    (target,) = [c[-1] for c in copies if "deploy/constraints.txt" in c[:-1]]
    (install,) = [rest for kw, rest in instructions if kw == "RUN" and "pip install" in rest]
    assert f"--constraint={target} " in install, install
    # The build backend in pip's isolated build environment too.
    assert f"PIP_CONSTRAINT={target} " in install


def constraints() -> dict[str, str]:
    """deploy/constraints.txt: normalised name -> pinned version."""
    pins: dict[str, str] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][A-Za-z0-9.+!-]*)", line)
        assert match, f"{CONSTRAINTS}: not NAME==VERSION: {line!r}"
        name = canonicalize_name(match.group(1))
        assert name not in pins, f"{CONSTRAINTS}: {name} pinned twice"
        pins[name] = match.group(2)
    return pins


def test_constraints_pin_every_dependency_within_pyproject_ranges() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    required = [
        *project["dependencies"],
        *project["optional-dependencies"]["demo"],  # the image's EXTRAS=demo (compose writer)
        *pyproject["build-system"]["requires"],
    ]
    pins = constraints()
    for text in required:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{CONSTRAINTS} does not pin {requirement.name}"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{CONSTRAINTS}: {name}=={pins[name]} is outside pyproject.toml's {text!r}"
        )
    # Transitive dependencies are pinned too (a handful of well-known ones, as a check that
    # the file is the whole closure, not the top level only).
    assert {"botocore", "pydantic-core", "yarl", "multidict"} <= set(pins)


# --- docker-compose -------------------------------------------------------------------------


def compose_argv(svc: Mapping[str, Any]) -> list[str]:
    command = svc["command"]
    return image_entrypoint() + (shlex.split(command) if isinstance(command, str) else command)


def test_compose_runs_replicas_of_one_configuration() -> None:
    """Two (or more) daemons built from the Dockerfile run the same command line with the
    same mounted configuration and environment: together they are one replica group."""
    replicas = compose_replicas()
    assert len(replicas) >= 2, f"replicas of the daemon: {sorted(replicas)}"
    config = load_config(CONFIG)
    for name, svc in replicas.items():
        args = parse_cli(compose_argv(svc))
        assert args.command == "serve", name
        assert not args.available_now, name
        mounts = {target: (source, ro) for source, target, ro in compose_mounts(svc)}
        assert args.config in mounts, f"{name}: {args.config} is not mounted in the container"
        source, read_only = mounts[args.config]
        assert (COMPOSE.parent / source).resolve() == CONFIG.resolve()
        assert read_only
        _, port = http_address(config, args)
        assert port == 9464
    # One image, one command line, one environment: nothing tells the replicas apart but
    # their containers (and the host ports below).
    for key in ("image", "command", "environment", "build"):
        values = [json.dumps(svc.get(key), sort_keys=True) for svc in replicas.values()]
        assert len(set(values)) == 1, f"the replicas' {key} differ: {values}"


def test_compose_publishes_each_replicas_metrics_port_on_loopback_only() -> None:
    config = load_config(CONFIG)
    host, port = parse_address(config.http_address or "")
    assert host == "0.0.0.0"
    published = []
    for name, svc in compose_replicas().items():
        ports = compose_ports(svc)
        assert len(ports) == 1, f"{name}: {ports}"
        ((host_ip, host_port, target),) = ports
        assert (host_ip, target) == ("127.0.0.1", port), name
        published.append(host_port)
    # Each replica's /healthz and /metrics at a port of its own on the host.
    taken = [p for _, p, _ in compose_ports(service("minio"))]
    assert len(set(published)) == len(published) and not set(published) & set(taken)
    assert port in published  # the first one where the README's curl looks


def test_compose_stop_grace_and_start_order() -> None:
    config = load_config(CONFIG)
    for name, svc in compose_replicas().items():
        # The streams stop at a delivery boundary, then the replica releases its leases:
        # SIGKILL before that leaves the streams standing for lease_ttl.
        assert seconds(svc["stop_grace_period"]) > stop_bound(config) > DEFAULT_GRACE, name
        depends = svc["depends_on"]
        assert depends["minio"]["condition"] == "service_healthy"
        assert depends["minio-init"]["condition"] == "service_completed_successfully"
        assert svc["restart"] == "unless-stopped"
    assert service("minio")["healthcheck"]["test"]
    assert service("minio-init")["image"].startswith("minio/mc")


def test_compose_sink_files_are_on_one_volume_every_replica_mounts() -> None:
    """A stream moves between replicas: whichever runs it must find its file sink's output
    where the other left it, on the same named volume (one Docker host, so the file's lock
    holds across the containers)."""
    named = set(compose().get("volumes") or {})
    config = load_config(CONFIG)
    paths = list(local_paths(config))
    assert paths, "no local sink file: nothing to check"
    for path in paths:
        where = set()
        for name, svc in compose_replicas().items():
            writable = [(s, t) for s, t, ro in compose_mounts(svc) if s in named and not ro]
            mounts = [(s, t) for s, t in writable if under(path, t)]
            assert mounts, f"{name}: {path} is on no named volume"
            where.add(max(mounts, key=lambda m: len(m[1])))
        assert len(where) == 1, f"{path} is on different volumes in different replicas: {where}"


def test_compose_creates_the_buckets_and_serves_the_endpoint_the_config_names() -> None:
    config = load_config(CONFIG)
    uris = [s.tail.uri for s in config.streams] + [s.tail.state for s in config.streams]
    uris += [config.group.uri] if config.group is not None else []
    buckets = {u.removeprefix("s3://").split("/")[0] for u in uris if u.startswith("s3://")}
    assert len(buckets) >= 2  # the lake, and the replicas' state and leases
    script = " ".join(service("minio-init")["command"])
    created = set(re.findall(r"mc mb (?:--\S+ )*\w+/([\w.-]+)", script))
    assert buckets <= created, f"minio-init does not create {sorted(buckets - created)}"
    minio = service("minio")
    every = [(s.tail.name, s.tail.storage_options) for s in config.streams]
    every += [(f"{s.tail.name} state", s.tail.resolved_state_options) for s in config.streams]
    every += [("group", config.group.storage_options)] if config.group is not None else []
    for name, options in every:
        endpoint = S3Options.from_storage_options(options).endpoint_url
        match = re.fullmatch(r"http://([\w-]+):(\d+)", endpoint or "")
        assert match, f"{name}: endpoint {endpoint!r}"
        assert match.group(1) == "minio"
        assert int(match.group(2)) in [c for _, _, c in compose_ports(minio)]
    # The credentials the config leaves to the AWS chain are in the environment.
    minio_env = minio["environment"]
    for svc in compose_replicas().values():
        environment = svc["environment"]
        assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(environment)
        assert environment["AWS_ACCESS_KEY_ID"] == minio_env["MINIO_ROOT_USER"]
        assert environment["AWS_SECRET_ACCESS_KEY"] == minio_env["MINIO_ROOT_PASSWORD"]


def test_compose_writer_writes_the_configured_tables() -> None:
    writer = service("writer")
    assert writer["profiles"] == ["writer"]
    script = writer["entrypoint"][-1]
    mounts = {target: source for source, target, _ in compose_mounts(writer)}
    assert (COMPOSE.parent / mounts[script]).resolve() == WRITER
    tables = [u for u in writer["command"] if u.startswith("s3://")]
    assert sorted(tables) == sorted(s.tail.uri for s in load_config(CONFIG).streams)
    assert writer["build"]["args"]["EXTRAS"] == "demo"  # deltalake
    assert writer["environment"]["AWS_ENDPOINT_URL"] == "http://minio:9000"


def test_writer_script_creates_tables_deltastream_can_follow(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("write_demo_tables", WRITER)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = tmp_path / "orders"
    assert module.main(["--interval", "0", "--commits", "4", str(table)]) == 0
    changes = read_changes(str(table)).read_all()
    kinds = Counter(changes.column("_change_type").to_pylist())
    assert kinds["insert"] >= 10 and kinds["update_postimage"] and kinds["delete"]
    assert max(changes.column("_commit_version").to_pylist()) == 4


def test_compose_stack_runs_against_an_s3_server(s3_server: S3Server, tmp_path: Path) -> None:
    """What compose runs, minus Docker: the writer script and two ``deltastream serve``
    replicas of deploy/config/deltastream.toml, MinIO replaced by the moto server (buckets of
    their own) and the shared volume by a temporary directory. Each stream runs on exactly
    one replica and both are ready; SIGTERM to a replica that runs streams hands them to the
    other at once, which goes on with the commits made after; every change row the writer
    made arrives in the configured sinks exactly once, and both replicas exit with status 0."""
    lake, state = (f"{name}-{uuid.uuid4().hex[:8]}" for name in ("lake", "deltastream"))
    for bucket in (lake, state):
        s3_server.client().create_bucket(Bucket=bucket)
    text = (
        CONFIG.read_text()
        .replace("http://minio:9000", s3_server.endpoint)
        .replace("s3://lake/", f"s3://{lake}/")
        .replace("s3://deltastream/", f"s3://{state}/")
        .replace("/var/lib/deltastream", str(tmp_path))
    )
    assert text.count(s3_server.endpoint) == 1 and str(tmp_path) in text
    assert f"s3://{state}/" in text
    config_path = tmp_path / "deltastream.toml"
    config_path.write_text(text)
    config = load_config(config_path)
    assert config.group is not None and config.group.uri.startswith(f"s3://{state}/")
    names = {s.tail.name for s in config.streams}
    uris = [s.tail.uri for s in config.streams]
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_ENDPOINT_URL": s3_server.endpoint,
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
        "PYTHONUNBUFFERED": "1",
    }
    deltalake_options = {
        k: env[k] for k in env if k.startswith("AWS_") and k != "AWS_DEFAULT_REGION"
    }

    def write(commits: int) -> int:
        """``commits`` rounds of the writer; the tables' version after them."""
        writer = subprocess.run(
            [sys.executable, str(WRITER), "--interval", "0", "--commits", str(commits), *uris],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert writer.returncode == 0, writer.stderr
        versions = {DeltaTable(u, storage_options=deltalake_options).version() for u in uris}
        assert len(versions) == 1, versions
        return versions.pop()

    replicas: list[tuple[subprocess.Popen[str], int]] = []

    def start() -> tuple[subprocess.Popen[str], int]:
        """A replica as compose runs it, with its own port (compose maps each container's
        9464 to a host port of its own; here ``--http`` does)."""
        port = free_port()
        while port in [p for _, p in replicas]:
            port = free_port()
        log = tmp_path / f"replica-{port}.log"
        with log.open("w") as stderr:
            process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "deltastream", "serve"),
                    *("--config", str(config_path), "--http", f"127.0.0.1:{port}"),
                ],
                env={k: v for k, v in env.items() if k != "AWS_ENDPOINT_URL"},  # the config's
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                text=True,
            )
        replicas.append((process, port))
        return process, port

    def logs() -> str:
        return "\n".join((tmp_path / f"replica-{p}.log").read_text()[-3000:] for _, p in replicas)

    def health(port: int) -> tuple[int, dict[str, dict[str, Any]]]:
        """A replica's /healthz status and its tables by name."""
        status, body = _get(f"http://127.0.0.1:{port}/healthz")
        return status, {t["name"]: t for t in json.loads(body)["tables"]} if body else {}

    def running(version: int, among: list[tuple[subprocess.Popen[str], int]]) -> dict[str, int]:
        """Wait until each stream runs on exactly one replica of ``among`` and has delivered
        ``version`` there, the others standing by for it, every replica ready (/healthz
        200); the port of the replica running each stream."""
        deadline = time.monotonic() + 90
        while True:
            owners: dict[str, list[int]] = {}
            delivered: dict[str, int] = {}
            settled = True
            for process, port in among:
                assert process.poll() is None, logs()
                status, tables = health(port)
                settled &= status == 200 and set(tables) == names
                for name, table in tables.items():
                    if table["owned"]:
                        owners.setdefault(name, []).append(port)
                        delivered[name] = table["last_delivered_version"]
                    else:
                        settled &= table["status"] == "standby"
            if settled and all(
                len(owners.get(n, [])) == 1 and delivered[n] == version for n in names
            ):
                return {name: ports[0] for name, ports in owners.items()}
            assert time.monotonic() < deadline, (owners, delivered, logs())
            time.sleep(0.2)

    version = write(0)  # creates the tables: version 0
    codes = []
    try:
        both = [start(), start()]
        running(version, both)
        version = write(4)  # an append, an update, an append, a delete: versions 1 to 4
        owners = running(version, both)
        # The hand-over: a replica that runs streams stops (a rolling update's SIGTERM).
        busy = next(r for r in both if r[1] in owners.values())
        (rest,) = [r for r in both if r is not busy]
        busy[0].send_signal(signal.SIGTERM)
        assert busy[0].wait(timeout=30) == 0, logs()
        stopped = time.monotonic()
        while not all(t["owned"] for t in health(rest[1])[1].values()):
            # Taken over from a replica that left, not from one whose lease ran out.
            assert time.monotonic() - stopped < config.group.lease_ttl / 2, logs()
            time.sleep(0.1)
        version = write(3)  # versions 5 to 7, delivered by the replica left
        running(version, [rest])
        status, body = _get(f"http://127.0.0.1:{rest[1]}/livez")
        assert (status, json.loads(body)) == (200, {"status": "alive"})
    finally:
        for process, _ in replicas:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        codes = [process.wait(timeout=30) for process, _ in replicas]
    assert codes == [0, 0], logs()
    for stream in config.streams:
        sink = parse_sink(stream.sink, table=stream.tail.name)
        if isinstance(sink, JsonlSink):
            assert sink.path is not None
            got = pa.Table.from_pylist(
                [json.loads(line) for line in sink.path.read_text().splitlines()]
            )
        else:
            assert isinstance(sink, ParquetSink)
            got = pa.concat_tables(
                pq.read_table(f) for f in sorted(sink.directory.glob("*.parquet"))
            )
        # The default mode: the snapshot at version 0 as inserts, then every change. Replayed
        # in order, they rebuild the table as deltastream's reader sees it at the end.
        assert got.filter(pc.equal(got["_commit_version"], 0))[
            "_change_type"
        ].unique().to_pylist() == ["insert"]
        assert sorted(set(got.column("_commit_version").to_pylist())) == list(range(version + 1))
        # No delivery twice, the one the hand-over interrupted or resumed included.
        repeated = [
            row
            for row, n in Counter(tuple(sorted(r.items())) for r in got.to_pylist()).items()
            if n > 1
        ]
        assert not repeated, repeated
        rebuilt: dict[int, tuple[Any, ...]] = {}
        columns = ["id", "country", "status", "amount"]
        # Within a version, rows come in file order: a cdc file may hold an update's
        # postimage before its preimage. Replay each version's removals first.
        removal = {"delete": 0, "update_preimage": 0, "insert": 1, "update_postimage": 1}
        in_order = sorted(
            got.to_pylist(), key=lambda r: (r["_commit_version"], removal[r["_change_type"]])
        )
        for row in in_order:
            values = tuple(row[c] for c in columns)
            if row["_change_type"] in ("insert", "update_postimage"):
                assert row["id"] not in rebuilt, row
                rebuilt[row["id"]] = values
            else:
                assert rebuilt.pop(row["id"]) == values, row
        final = DeltaTable(stream.tail.uri, storage_options=deltalake_options)
        assert final.version() == version
        final_rows = final.to_pyarrow_table(columns=columns).to_pylist()
        assert rebuilt == {r["id"]: tuple(r[c] for c in columns) for r in final_rows}


def _get(url: str) -> tuple[int, str]:
    """An HTTP GET's status and body; (0, "") while nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status), str(response.read().decode())
    except urllib.error.HTTPError as e:
        return int(e.code), str(e.read().decode())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, ""


# --- Kubernetes -----------------------------------------------------------------------------


def test_k8s_command_line_parses_and_uses_the_configmap() -> None:
    args, config = mounted_config(pod_spec())
    assert args.command == "serve"
    assert not args.available_now
    assert config == parse_config(configmap_toml())  # the ConfigMap of configmap.yaml
    assert http_address(config, args) == ("0.0.0.0", 9464)


def test_k8s_ports_probes_and_service_agree() -> None:
    _, port = parse_address(parse_config(configmap_toml()).http_address or "")
    spec = container()
    assert {p.get("name"): p["containerPort"] for p in spec["ports"]} == {"metrics": port}
    # Liveness (and start-up, which gates it) on /livez: a table or sink that is down makes
    # /healthz 503, and must not get the pod restarted in a loop. Readiness on /healthz:
    # 200 when the replica serves its streams or stands by correctly, which is what a
    # rolling update waits for before it stops an old pod.
    paths = {"livenessProbe": "/livez", "readinessProbe": "/healthz", "startupProbe": "/livez"}
    for probe, path in paths.items():
        if probe == "startupProbe" and probe not in spec:
            continue
        check = spec[probe]["httpGet"]
        assert check["path"] == path, probe
        assert container_port(spec, check["port"]) == port
    svc = k8s("Service")
    assert svc["spec"].get("type", "ClusterIP") == "ClusterIP"
    # An unready (degraded) pod still gets scraped through the Service.
    assert svc["spec"]["publishNotReadyAddresses"] is True
    (service_port,) = svc["spec"]["ports"]
    assert container_port(spec, service_port["targetPort"]) == port
    labels = k8s("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert selects({"matchLabels": svc["spec"]["selector"]}, labels)
    annotations = svc["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] == "/metrics"


def test_k8s_replicas_share_the_streams_through_the_object_store() -> None:
    """Two or more replicas of one configuration: a replica group (its leases and every
    stream's state in the object store), and no output a pod keeps on its own disk, since
    any replica may run any stream."""
    deployment = k8s("Deployment")
    assert deployment["spec"]["replicas"] >= 2
    config = parse_config(configmap_toml())
    assert config.group is not None and in_object_store(config.group.uri)
    assert all(in_object_store(s.tail.state) for s in config.streams)
    # The only local path is the exec sinks' work_dir (batch files for one delivery).
    kept = [p for p in local_paths(config) if config.work_dir is None or p != config.work_dir]
    assert not kept, f"files on a pod's own disk, where another replica cannot reach: {kept}"
    # The selector picks the pods the Deployment makes, and only those.
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selects(deployment["spec"]["selector"], labels)


def test_k8s_rolls_without_a_gap_and_stops_within_the_grace_period() -> None:
    strategy = k8s("Deployment")["spec"]["strategy"]
    # A new pod joins (and is ready, standing by) before an old one stops and hands over;
    # the group is never a replica short.
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["maxUnavailable"] == 0
    assert strategy["rollingUpdate"]["maxSurge"] >= 1
    config = parse_config(configmap_toml())
    assert config.group is not None
    # SIGKILL before the leases are released leaves the pod's streams standing lease_ttl.
    assert pod_spec()["terminationGracePeriodSeconds"] > stop_bound(config) > DEFAULT_GRACE
    assert stop_bound(config) > config.shutdown_grace


def test_k8s_spreads_the_replicas_over_nodes() -> None:
    labels = k8s("Deployment")["spec"]["template"]["metadata"]["labels"]
    spreads = pod_spec()["topologySpreadConstraints"]
    by_node = [s for s in spreads if s["topologyKey"] == "kubernetes.io/hostname"]
    assert by_node, spreads
    for spread in by_node:
        # A selector that missed the pods would spread nothing.
        assert selects(spread["labelSelector"], labels)
        assert spread["maxSkew"] == 1
        # DoNotSchedule would leave a surge pod pending on a cluster a node short.
        assert spread["whenUnsatisfiable"] == "ScheduleAnyway"


def test_k8s_disruption_budget_keeps_a_replica_running() -> None:
    deployment, pdb = k8s("Deployment"), k8s("PodDisruptionBudget")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selects(pdb["spec"]["selector"], labels)
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    replicas = deployment["spec"]["replicas"]
    spec = pdb["spec"]
    assert ("minAvailable" in spec) != ("maxUnavailable" in spec)
    allowed = (
        spec["maxUnavailable"] if "maxUnavailable" in spec else replicas - spec["minAvailable"]
    )
    assert isinstance(allowed, int)  # not a percentage: the arithmetic below holds
    # A drain may evict one (it would block forever at 0) and never every replica at once.
    assert 1 <= allowed < replicas
    # A pod unready for a degraded stream must not block a drain.
    assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


@pytest.mark.parametrize("pod", ["Deployment", "CronJob"])
def test_k8s_runs_non_root_on_a_read_only_root_with_nothing_on_local_disk(pod: str) -> None:
    spec = pod_spec() if pod == "Deployment" else cron_pod_spec()
    main = container(spec)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == image_uid()
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    assert main["securityContext"]["allowPrivilegeEscalation"] is False
    assert main["securityContext"]["capabilities"]["drop"] == ["ALL"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    # No claim: a replica's disk is its own, and the pod may be rescheduled anywhere.
    assert not [v for v in volumes.values() if "persistentVolumeClaim" in v]
    writable = {
        m["mountPath"]: volumes[m["name"]] for m in main["volumeMounts"] if not m.get("readOnly")
    }
    assert all("emptyDir" in v for v in writable.values()), writable
    assert "/tmp" in writable  # temporary files (exec sinks) on a read-only root
    _, config = mounted_config(spec)
    for path in local_paths(config):
        assert any(under(path, m) for m in writable), f"{path} is not on a writable volume"
    assert main["resources"]["requests"] and main["resources"]["limits"]["memory"]


def test_k8s_keeps_no_persistent_volume() -> None:
    # pvc.yaml held the one replica's state and sink files; the state is in the object store
    # now, and a claim in the folder would only be applied and never used.
    assert k8s_objects("PersistentVolumeClaim") == []
    assert not (K8S / "pvc.yaml").exists()


@pytest.mark.parametrize("pod", ["Deployment", "CronJob"])
def test_k8s_credentials_come_from_a_secret(pod: str) -> None:
    env = {
        e["name"]: e
        for e in container(pod_spec() if pod == "Deployment" else cron_pod_spec())["env"]
    }
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert "value" not in env[name]
        assert env[name]["valueFrom"]["secretKeyRef"]["key"] == name
        assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "deltastream-aws"


def test_k8s_cronjob_runs_available_now_once_at_a_time() -> None:
    cron = k8s("CronJob")
    assert len(cron["spec"]["schedule"].split()) == 5, cron["spec"]["schedule"]
    # A run still going when the next is due is left alone: the next is skipped.
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    job = cron["spec"]["jobTemplate"]["spec"]
    spec = cron_pod_spec()
    assert spec["restartPolicy"] == "Never"
    args, config = mounted_config(spec)
    assert args.command in ("serve", "tail")
    assert args.available_now is True
    assert container(spec)["image"] == container()["image"]
    # Exit status 2 (a configuration error, a stream another process holds) fails the Job
    # at once: a retry of the same pod fails the same way.
    (rule,) = job["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob"
    assert rule["onExitCodes"] == {
        "containerName": container(spec)["name"],
        "operator": "In",
        "values": [2],
    }
    # A run cut short stops cleanly (and releases its streams) before SIGKILL.
    assert spec["terminationGracePeriodSeconds"] > stop_bound(config) > DEFAULT_GRACE


def test_k8s_cronjob_streams_are_not_the_replicas() -> None:
    """A run-once job on a stream the replica group holds is refused (exit 2): the job's
    streams, its lease directory and its outputs are its own, and its pod is no replica."""
    _, job = mounted_config(cron_pod_spec())
    replicas = parse_config(configmap_toml())
    assert job.group is not None and replicas.group is not None

    def apart(a: str, b: str) -> bool:
        a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
        return not a.startswith(b) and not b.startswith(a)

    for mine in [job.group.uri, *(s.tail.state for s in job.streams)]:
        for theirs in [replicas.group.uri, *(s.tail.state for s in replicas.streams)]:
            assert apart(mine, theirs), f"the job's {mine} and the replicas' {theirs} overlap"

    def outputs(config: ServiceConfig) -> set[str | None]:
        return {
            parse_sink(s.sink, table=s.tail.name, stream=s.tail).output_claim(s.tail.name)
            for s in config.streams
        }

    assert None not in outputs(job)
    assert not outputs(job) & outputs(replicas)
    # The job's pod is counted by none of the Deployment's selectors.
    labels = k8s("CronJob")["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    selectors = [
        k8s("Deployment")["spec"]["selector"],
        k8s("PodDisruptionBudget")["spec"]["selector"],
        {"matchLabels": k8s("Service")["spec"]["selector"]},
        *(s["labelSelector"] for s in pod_spec()["topologySpreadConstraints"]),
    ]
    for selector in selectors:
        assert not selects(selector, labels), (selector, labels)


# --- systemd --------------------------------------------------------------------------------


def test_systemd_command_line_parses_and_uses_the_asserted_config() -> None:
    argv = shlex.split(unit_value("Service", "ExecStart"))
    assert PurePosixPath(argv[0]).is_absolute()
    args = parse_cli(argv)
    assert args.command == "serve"
    assert args.config in unit()["Unit"]["AssertPathExists"]
    assert args.http is None


def test_systemd_stop_restart_and_user() -> None:
    assert unit_value("Service", "KillSignal") == "SIGTERM"
    # A host's configuration, started from the compose one, forms a group too: the stop
    # includes releasing its leases.
    assert seconds(unit_value("Service", "TimeoutStopSec")) > stop_bound(load_config(CONFIG))
    assert seconds(unit_value("Service", "TimeoutStopSec")) > DEFAULT_GRACE
    assert unit_value("Service", "Restart") == "on-failure"
    assert unit_value("Service", "User") not in ("root", "0")
    assert unit_value("Service", "EnvironmentFile") == "-/etc/deltastream/env"
    assert unit_value("Install", "WantedBy") == "multi-user.target"


def test_systemd_hardening_leaves_the_state_directory_writable() -> None:
    assert unit_value("Service", "NoNewPrivileges") == "yes"
    assert unit_value("Service", "ProtectSystem") == "strict"
    assert unit_value("Service", "PrivateTmp") == "yes"
    state = "/var/lib/" + unit_value("Service", "StateDirectory")
    assert state == "/var/lib/deltastream"
    assert state in unit_value("Service", "ReadWritePaths").split()
    assert unit_value("Service", "WorkingDirectory") == state


def test_systemd_limits_memory_and_runs_a_watchdog() -> None:
    limit = unit_value("Service", "MemoryMax")
    match = re.fullmatch(r"(\d+)([KMGT]?)", limit)
    assert match, f"MemoryMax={limit}: not a size"
    scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[match.group(2)]
    assert int(match.group(1)) * scale >= 512 * 2**20
    # Type=notify: the daemon says READY=1 (deltastream/daemon/service/sd_notify.py), and pings the
    # watchdog every WatchdogSec/2; only the main process may notify.
    assert unit_value("Service", "Type") == "notify"
    assert unit_value("Service", "NotifyAccess") == "main"
    assert seconds(unit_value("Service", "WatchdogSec")) >= 30
    assert unit_value("Service", "Restart") == "on-failure"  # a watchdog kill restarts it
    # The notification socket is a unix socket: the address families allow it.
    assert "AF_UNIX" in unit_value("Service", "RestrictAddressFamilies").split()


# --- Prometheus alert rules and the Grafana dashboard ----------------------------------------

#: A metric name in an expression (``deltastream_up`` and the like, not the job "deltastream").
METRIC_NAME = re.compile(r"\bdeltastream_[a-z0-9_]+\b")
#: Grafana's variables, as the test's Prometheus queries replace them.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$job": ".*", "$table": ".*"}


def alert_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    rules = [rule for group in document["groups"] for rule in group["rules"]]
    assert all("alert" in rule and "expr" in rule for rule in rules), rules
    return rules


def dashboard() -> dict[str, Any]:
    document = json.loads(DASHBOARD.read_text())
    assert isinstance(document, dict)
    return document


def dashboard_panels() -> list[dict[str, Any]]:
    """The dashboard's panels, rows' panels included, rows themselves not."""
    panels: list[dict[str, Any]] = []
    for panel in dashboard()["panels"]:
        panels += [panel] if panel["type"] != "row" else panel.get("panels", [])
    return panels


def dashboard_queries() -> list[str]:
    """Every PromQL expression of the dashboard: its panels' and its variables' (Grafana's
    ``label_values(SELECTOR, label)`` as the selector)."""
    exprs = [target["expr"] for panel in dashboard_panels() for target in panel["targets"]]
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((.+), \w+\)", variable["query"]["query"])
            assert match, variable
            exprs.append(match.group(1))
    return exprs


def with_variables(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a Grafana variable the test does not know: {expr}"
    return expr


def served_names(text: str) -> set[str]:
    """The metric names an exposition serves: its families', and a histogram's series."""
    names: set[str] = set()
    for name, kind in families(text).items():
        names |= (
            {f"{name}_bucket", f"{name}_sum", f"{name}_count"} if kind == "histogram" else {name}
        )
    return names


def test_alert_rules_pass_promtool_and_their_unit_tests() -> None:
    checked = promtool("check", "rules", str(ALERTS))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in checked.stdout
    tested = promtool("test", "rules", str(ALERTS_TEST))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # The rules the issue asks for are there, each tested.
    names = {rule["alert"] for rule in alert_rules()}
    wanted = {
        "DeltastreamLagVersions",
        "DeltastreamLagSeconds",
        "DeltastreamStreamNotRunning",
        "DeltastreamSinkFailures",
        "DeltastreamNoDelivery",
    }
    assert wanted <= names
    tests = yaml.safe_load(ALERTS_TEST.read_text())["tests"]
    tested_names = {case["alertname"] for t in tests for case in t["alert_rule_test"]}
    assert tested_names == names
    for rule in alert_rules():
        assert rule["labels"]["severity"] in ("warning", "critical"), rule
        assert {"summary", "description"} <= set(rule["annotations"]), rule


def test_dashboard_is_a_grafana_dashboard() -> None:
    board = dashboard()
    assert board["uid"] == "deltastream" and board["title"] == "deltastream"
    assert isinstance(board["schemaVersion"], int) and board["panels"]
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in dashboard_panels():
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval"}
            assert used <= set(variables), (panel["title"], used)


@pytest.mark.anyio
async def test_rules_and_dashboard_use_what_the_daemon_serves_in_a_real_prometheus(
    tmp_path: Path,
) -> None:
    """A running daemon scraped by a real Prometheus server that loads alerts.yml: every
    metric the rules (and their tests) and the dashboard name is in ``/metrics``; every rule
    evaluates without error; every dashboard query runs, and returns series whenever the
    metrics it reads have samples."""
    uri = str(tmp_path / "orders")
    write_deltalake(uri, pa.table({"id": pa.array(range(10), pa.int64())}))
    tail = TailConfig(
        name="orders",
        uri=uri,
        state=str(tmp_path / "state"),
        mode=Mode.FOLLOW,
        start=StartFrom(version=0),
        poll_interval=0.05,
    )
    port = free_port()
    config = ServiceConfig(
        streams=(StreamConfig(tail, f"jsonl:{tmp_path / 'orders.jsonl'}"),),
        http_address=f"127.0.0.1:{port}",
    )
    service = Service(config)
    m = service.metrics["orders"]
    with run_prometheus(tmp_path, f"127.0.0.1:{port}", rule_files=[ALERTS]) as prometheus:
        async with anyio.create_task_group() as tg:
            await tg.start(service.run)

            async def delivered() -> bool:
                return m.last_delivered_version == 0

            await until(delivered)
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"http://127.0.0.1:{port}/metrics") as resp,
            ):
                text = await resp.text()
            served = served_names(text)
            with_samples = {name for name, _ in series(text)}

            used: dict[str, set[str]] = {}
            test_series = [
                s["series"]
                for t in yaml.safe_load(ALERTS_TEST.read_text())["tests"]
                for s in t["input_series"]
            ]
            for source, exprs in (
                ("alerts.yml", [rule["expr"] for rule in alert_rules()]),
                ("alerts_test.yml", test_series),
                ("deltastream.json", dashboard_queries()),
            ):
                for expr in exprs:
                    for name in METRIC_NAME.findall(expr):
                        used.setdefault(name, set()).add(source)
            assert len(used) >= 15, sorted(used)
            missing = {name: sorted(where) for name, where in used.items() if name not in served}
            assert not missing, f"not in /metrics: {missing}"

            # Prometheus has scraped the stream's delivery and evaluated every rule.
            rules: list[dict[str, Any]] = []

            async def scraped_and_evaluated() -> bool:
                # rate() over the dashboard's 1m wants a few samples of a delivery.
                scrapes = "count_over_time(deltastream_rows_delivered_total[1m]) >= 4"
                if not await prometheus.query(scrapes):
                    return False
                groups = (await prometheus.get("/api/v1/rules"))["data"]["groups"]
                rules[:] = [rule for group in groups for rule in group["rules"]]
                return bool(rules) and all(r["health"] != "unknown" for r in rules)

            await until(scraped_and_evaluated)
            assert len(rules) == len(alert_rules())
            bad = [
                (r["name"], r["health"], r.get("lastError")) for r in rules if r["health"] != "ok"
            ]
            assert not bad, bad
            firing = [r["name"] for r in rules if r["state"] == "firing"]
            assert not firing, f"alerts firing on a healthy daemon: {firing}"

            for expr in dashboard_queries():
                if set(METRIC_NAME.findall(expr)) <= with_samples:
                    # Waited for: a scrape that timed out on a loaded machine marks the
                    # series stale, and an instant query finds none until the next one.
                    async def has_series(query: str = with_variables(expr)) -> bool:
                        return bool(await prometheus.query(query))

                    try:
                        await until(has_series)
                    except TimeoutError:
                        pytest.fail(f"no series for {expr}")
                else:
                    await prometheus.query(with_variables(expr))  # valid, if empty
            # The state timeline's one value per stream: following is state 3.
            (timeline,) = [
                t["expr"]
                for p in dashboard_panels()
                if p["type"] == "state-timeline"
                for t in p["targets"]
            ]
            (state,) = await prometheus.query(with_variables(timeline))
            assert state["metric"]["table"] == "orders" and float(state["value"][1]) == 3
            service.stop()


# --- README ---------------------------------------------------------------------------------


def test_readme_mentions_every_file_in_deploy() -> None:
    readme = (DEPLOY / "README.md").read_text()
    files = [
        p.relative_to(DEPLOY).as_posix()
        for p in DEPLOY.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.name != "README.md"
    ]
    assert len(files) >= 8
    missing = [f for f in files if f not in readme]
    assert not missing, f"deploy/README.md does not mention {missing}"
    # Nor one that is gone (pvc.yaml was), here or in docs/operations.md's table.
    operations = (ROOT / "docs" / "operations.md").read_text()
    for text in (readme, operations):
        named = re.findall(
            r"`((?:kubernetes|config|systemd|prometheus|grafana|writer)/[\w.-]+)`", text
        )
        assert named
        gone = [f for f in named if not (DEPLOY / f).exists()]
        assert not gone, f"mentioned but not in deploy/: {gone}"
    facts = ("9464", "/healthz", "/livez", "/metrics", "0.0.0.0", "RollingUpdate", "standby")
    facts += ("PodDisruptionBudget", "--available-now", "concurrencyPolicy: Forbid", "lease_ttl")
    for fact in (*facts, "degraded_after_seconds", "max_restarts", "tests/test_deploy.py"):
        assert fact in readme, fact
    for service_name in compose_replicas():
        assert service_name in readme, service_name
