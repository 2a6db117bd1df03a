"""Mutation fuzzing of Delta logs: does every broken log give a clear error?

Each input is a real table (a corpus table, copied) with one log file mutated: a commit,
a checkpoint (classic, multi-part, V2 JSON or parquet, a sidecar), ``_last_checkpoint``, a
``.crc`` or a deletion-vector file. The mutations are structural (an action or a field
dropped, duplicated, nulled, given another type; lines swapped or repeated) and byte-level
(bytes flipped, inserted, truncated). deltastream then loads the snapshot, reads the rows
and reads the change data feed, in a worker process with a time limit and a memory limit.

Each input's outcome is one of:

* ``ok``: everything read, and the same as from the unmutated table;
* ``ok-different``: everything read, differently (the mutation made another valid log, e.g.
  a value changed or a line dropped: counted, for review, not a failure in itself);
* ``error``: a ``DeltaStreamError`` naming the file (or table) it is about (the wanted
  outcome for a broken log); ``unnamed-error``: one that names neither (a finding);
* ``crash``: any other exception: a bug, printed with the input that caused it;
* ``hang``: over the time limit (10 s); ``memory``: over the memory limit.

Run it (a campaign; the suite runs a short one, ``tests/test_fuzz_log.py``)::

    python tests/benchmarks/fuzz_log.py --inputs 10000 --seed 1 --jobs 2

and it prints the inputs tried and the count of each outcome, then every crash, hang and
memory outcome with the seed and mutation that reproduce it (``--replay SEED:INDEX``).
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CORPORA = ROOT.parent / "shared" / "corpora"

#: Source tables: every kind of log file the mutations should reach.
TABLES = [
    "delta-kernel-rs/data/cdf-table-with-dv",
    "delta-kernel-rs/data/table-with-dv-small",
    "delta-kernel-rs/data/app-txn-checkpoint",
    "delta-kernel-rs/data/compacted-log-files-table",
    "delta-kernel-rs/data/crc-full",
    "delta-kernel-rs/data/cdf-column-mapping-name-mode",
    "delta-kernel-rs/data/v2-checkpoints-json-with-sidecars",
    "delta-kernel-rs/data/v2-checkpoints-parquet-with-last-checkpoint",
    "delta-kernel-rs/data/v1-multi-part-partitioned-struct-stats-only",
    "delta-rs/crates/test/tests/data/checkpoint-v2-table",
    "delta-rs/crates/test/tests/data/simple_table",
]

#: Every outcome, and those that are findings (bugs).
OUTCOMES = ("ok", "ok-different", "error", "unnamed-error", "crash", "hang", "memory")
FINDINGS = ("unnamed-error", "crash", "hang", "memory")

TIME_LIMIT = 10.0
#: Resident memory a worker may reach (checked by the parent: an address-space limit breaks
#: pyarrow's allocator, which reserves far more than it uses).
MEMORY_LIMIT = 1536 << 20


@dataclass(frozen=True)
class Input:
    seed: int
    index: int
    table: str
    file: str  # relative to the table root
    mutation: str

    @property
    def ref(self) -> str:
        return f"{self.seed}:{self.index}"


# --- mutations ------------------------------------------------------------------------------


def _mutate_bytes(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    if not data:
        return b"\x00", "empty file given one NUL byte"
    kind = rng.choice(["flip", "truncate", "insert", "zero", "duplicate"])
    at = rng.randrange(len(data))
    if kind == "flip":
        b = bytearray(data)
        b[at] ^= 1 << rng.randrange(8)
        return bytes(b), f"bit flipped at byte {at}"
    if kind == "truncate":
        return data[:at], f"truncated to {at} bytes"
    if kind == "insert":
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        return data[:at] + junk + data[at:], f"{len(junk)} random bytes inserted at {at}"
    if kind == "zero":
        n = rng.randint(1, 64)
        return data[:at] + b"\x00" * n + data[at + n :], f"{n} bytes zeroed at {at}"
    n = rng.randint(1, 256)
    return data[:at] + data[at : at + n] + data[at:], f"{n} bytes repeated at {at}"


_ODD_VALUES: list[Any] = [
    None, "", "x", -1, 0, 2**63, 1.5, True, [], {}, "%00", "/etc/hostname", "../x",
    "9" * 30, {"nested": {"deep": [1, 2]}},
]  # fmt: skip


def _walk(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths to every dict key and list item below ``value``."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield (*path, k)
            yield from _walk(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield (*path, i)
            yield from _walk(v, (*path, i))


def _mutate_json_lines(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    try:
        lines = [json.loads(line) for line in data.splitlines() if line.strip()]
    except ValueError:
        return _mutate_bytes(rng, data)
    if not lines:
        return _mutate_bytes(rng, data)
    kind = rng.choice(["field", "field", "field", "drop-line", "dup-line", "swap", "bytes"])
    i = rng.randrange(len(lines))
    if kind == "drop-line":
        del lines[i]
        what = f"line {i + 1} dropped"
    elif kind == "dup-line":
        lines.insert(i, json.loads(json.dumps(lines[i])))
        what = f"line {i + 1} repeated"
    elif kind == "swap" and len(lines) > 1:
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
        what = f"lines {i + 1} and {j + 1} swapped"
    elif kind == "field":
        paths = list(_walk(lines[i]))
        if not paths:
            return _mutate_bytes(rng, data)
        path = rng.choice(paths)
        parent = lines[i]
        for step in path[:-1]:
            parent = parent[step]
        key = path[-1]
        if rng.random() < 0.35 and isinstance(parent, dict):
            del parent[key]
            what = f"line {i + 1}: {'.'.join(map(str, path))} removed"
        else:
            value = rng.choice(_ODD_VALUES)
            parent[key] = value
            what = f"line {i + 1}: {'.'.join(map(str, path))} set to {json.dumps(value)[:40]}"
    else:
        return _mutate_bytes(rng, data)
    return ("".join(json.dumps(line) + "\n" for line in lines)).encode(), what


def _log_files(table: Path) -> list[Path]:
    # Hadoop's hidden ".x.crc" checksums are read by no Delta reader: not worth mutating.
    files = [
        p for p in (table / "_delta_log").rglob("*") if p.is_file() and not p.name.startswith(".")
    ]
    files += [p for p in table.rglob("*.bin") if p.is_file()]
    return sorted(files)


def make_input(seed: int, index: int) -> Input:
    rng = random.Random(f"{seed}:{index}")
    table = rng.choice(TABLES)
    root = CORPORA / table
    files = _log_files(root)
    target = rng.choice(files)
    return Input(seed, index, table, str(target.relative_to(root)), "")


def materialise(item: Input, workdir: Path) -> tuple[Path, str]:
    """Copy the table into ``workdir`` and mutate the file; returns the table and the
    mutation's description."""
    rng = random.Random(f"{item.seed}:{item.index}:mutate")
    table = workdir / "t"
    shutil.copytree(CORPORA / item.table, table)
    target = table / item.file
    data = target.read_bytes()
    text_like = target.suffix in (".json", ".crc") or target.name == "_last_checkpoint"
    mutated, what = (
        _mutate_json_lines(rng, data)
        if text_like and rng.random() < 0.8
        else _mutate_bytes(rng, data)
    )
    target.write_bytes(mutated)
    return table, what


# --- running one input ------------------------------------------------------------------------


def _consume(table: str) -> str:
    """Read everything; a digest of what was read (snapshot version, rows, change rows)."""
    import hashlib

    import deltastream as ds

    snapshot = ds.read_snapshot(table)
    rows = ds.read_rows(table).read_all()
    changes = ds.read_changes(
        table, start_version=0, infer_without_cdf=True, allow_empty_range=True
    ).read_all()
    digest = hashlib.sha256(str(snapshot.version).encode())
    for t in (rows, changes):
        lines = sorted(json.dumps(r, sort_keys=True, default=str) for r in t.to_pylist())
        digest.update("\n".join(lines).encode())
    return digest.hexdigest()


_BASELINES: dict[str, str] = {}


def _baseline(item: Input) -> str:
    """The digest of the unmutated table (computed once per table and worker process)."""
    if item.table not in _BASELINES:
        with tempfile.TemporaryDirectory() as tmp:
            table = Path(tmp) / "t"
            shutil.copytree(CORPORA / item.table, table)
            _BASELINES[item.table] = _consume(str(table))
    return _BASELINES[item.table]


def run_one(item: Input, queue: Any) -> None:
    """Worker body: materialise, consume, report (outcome, detail)."""
    with tempfile.TemporaryDirectory() as tmp:
        table, what = materialise(item, Path(tmp))
        from deltastream.errors import DeltaStreamError

        try:
            same = _consume(str(table)) == _baseline(item)
            queue.put(("ok" if same else "ok-different", what, ""))
        except DeltaStreamError as e:
            # A clear error names the file (or at least the table) it is about.
            named = str(Path(tmp)) in str(e)
            kind = "error" if named else "unnamed-error"
            queue.put((kind, what, f"{type(e).__name__}: {str(e)[:300]}"))
        except MemoryError:
            queue.put(("memory", what, "MemoryError"))
        except BaseException as e:  # the finding: anything else is a bug
            queue.put(("crash", what, "".join(traceback.format_exception(e))[-2500:]))


def run_input(item: Input, ctx: Any) -> tuple[str, str, str]:
    queue = ctx.Queue()
    proc = ctx.Process(target=run_one, args=(item, queue))
    proc.start()
    deadline = time.monotonic() + TIME_LIMIT
    while proc.is_alive() and time.monotonic() < deadline:
        proc.join(0.05)
        if _rss(proc.pid) > MEMORY_LIMIT:
            proc.kill()
            proc.join()
            return "memory", "", f"over {MEMORY_LIMIT >> 20} MiB resident"
    if proc.is_alive():
        proc.kill()
        proc.join()
        return "hang", "", f"over {TIME_LIMIT:g} s"
    try:
        result: tuple[str, str, str] = queue.get(timeout=1)
        return result
    except Exception:
        return "crash", "", f"worker died (exit {proc.exitcode})"


def _rss(pid: int | None) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def campaign(
    seed: int, inputs: int, jobs: int, report: Callable[[Input, str, str, str], None]
) -> collections.Counter[str]:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["deltastream", "pyarrow"])
    counts: collections.Counter[str] = collections.Counter()
    from concurrent.futures import ThreadPoolExecutor

    items = [make_input(seed, i) for i in range(inputs)]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for item, (outcome, what, detail) in zip(
            items, pool.map(lambda it: run_input(it, ctx), items), strict=True
        ):
            counts[outcome] += 1
            report(item, outcome, what, detail)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--replay", help="SEED:INDEX: run one input and show its outcome")
    args = parser.parse_args(argv)
    if args.replay:
        seed, index = map(int, args.replay.split(":"))
        item = make_input(seed, index)
        outcome, what, detail = run_input(item, mp.get_context("forkserver"))
        print(f"{item.ref} {item.table}/{item.file} ({what}): {outcome}\n{detail}")
        return 0
    started = time.monotonic()
    findings: list[str] = []

    def report(item: Input, outcome: str, what: str, detail: str) -> None:
        if outcome in FINDINGS:
            findings.append(
                f"--- {outcome} {item.ref}: {item.table}/{item.file} ({what})\n{detail}"
            )

    counts = campaign(args.seed, args.inputs, args.jobs, report)
    elapsed = time.monotonic() - started
    print(
        f"inputs {args.inputs} (seed {args.seed}, {args.jobs} jobs, {elapsed:.0f} s): "
        + ", ".join(f"{k} {counts[k]}" for k in OUTCOMES)
    )
    for finding in findings:
        print(finding)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
