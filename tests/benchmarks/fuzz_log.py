"""Mutation fuzzing of Delta logs: does every broken log give a clear error?

Each input is a real table (a corpus table, or one written here by ``deltalake``: change data
with updates and deletes, a checkpoint, an optimize; copied) with one log file mutated: a commit,
a checkpoint (classic, multi-part, V2 JSON or parquet, a sidecar), ``_last_checkpoint``, a
``.crc`` or a deletion-vector file. The mutations are structural (an action or a field
dropped, duplicated, nulled, given another type; lines swapped or repeated) and byte-level
(bytes flipped, inserted, truncated). deltastream then loads the snapshot, reads the rows
and reads the change data feed, in a worker process with a time limit and a memory limit.

Each input's outcome is one of:

* ``ok``: everything read, and the same as from the unmutated table;
* ``ok-different``: everything read, differently, and delta-kernel-rs reads the same rows
  from the mutated table (the mutation made another valid log, e.g. a value changed or a
  line dropped); ``ok-disputed``: read differently, and delta-kernel-rs refuses the table or
  reads other rows (counted and listed for review: the two readers may differ in what they
  accept, not a failure in itself);
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

#: Tables written by delta-rs for the campaign (in :data:`GENERATED`, once per machine and
#: ``deltalake`` version: their file names are random, so inputs replay on the machine that
#: generated them).
WRITTEN = ["deltalake/cdf-updates-checkpoint", "deltalake/optimized"]
GENERATED = Path(tempfile.gettempdir()) / "deltastream-fuzz-tables"


def _source(table: str) -> Path:
    return GENERATED / table if table in WRITTEN else CORPORA / table


def write_tables() -> None:
    """Write :data:`WRITTEN` with ``deltalake`` unless already there."""
    import deltalake
    import pyarrow as pa

    root = GENERATED / deltalake.__version__
    if all((root / t / "_delta_log").is_dir() for t in WRITTEN):
        _link(root)
        return
    shutil.rmtree(root, ignore_errors=True)
    cdf = root / "deltalake/cdf-updates-checkpoint"
    config = {"delta.enableChangeDataFeed": "true"}
    for i in range(4):
        rows = pa.table({"id": [3 * i, 3 * i + 1, 3 * i + 2], "p": [i % 2] * 3})
        deltalake.write_deltalake(str(cdf), rows, partition_by=["p"], mode="append",
                                  configuration=config)  # fmt: skip
    table = deltalake.DeltaTable(str(cdf))
    table.update(updates={"id": "id + 100"}, predicate="id < 2")
    table.delete("id = 5")
    table.create_checkpoint()
    deltalake.write_deltalake(str(cdf), pa.table({"id": [50], "p": [1]}), mode="append")
    optimized = root / "deltalake/optimized"
    for i in range(4):
        deltalake.write_deltalake(str(optimized), pa.table({"id": [i]}), mode="append")
    deltalake.DeltaTable(str(optimized)).optimize.compact()
    _link(root)


def _link(root: Path) -> None:
    for table in WRITTEN:
        link = GENERATED / table
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(root / table, target_is_directory=True)


#: Every outcome, and those that are findings (bugs).
OUTCOMES = (
    "ok", "ok-different", "ok-disputed", "error", "unnamed-error", "crash", "hang", "memory"
)  # fmt: skip
#: Outcomes listed after the counts, for review.
REVIEW = ("ok-disputed",)
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
    table = rng.choice(TABLES + WRITTEN)
    root = _source(table)
    files = _log_files(root)
    target = rng.choice(files)
    return Input(seed, index, table, str(target.relative_to(root)), "")


def materialise(item: Input, workdir: Path) -> tuple[Path, str]:
    """Copy the table into ``workdir`` and mutate the file; returns the table and the
    mutation's description."""
    rng = random.Random(f"{item.seed}:{item.index}:mutate")
    table = workdir / "t"
    shutil.copytree(_source(item.table), table)
    target = table / item.file
    data = target.read_bytes()
    text_like = target.suffix in (".json", ".crc") or target.name == "_last_checkpoint"
    mutated, what = (
        _mutate_json_lines(rng, data)
        if text_like and rng.random() < 0.8
        else _mutate_bytes(rng, data)
    )
    stat = target.stat()
    target.write_bytes(mutated)
    # The file keeps its time: commit timestamps come from it, and a new one would make
    # every mutated commit read "differently".
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    return table, what


# --- running one input ------------------------------------------------------------------------


def _rows_digest(rows: Any) -> str:
    import hashlib

    lines = sorted(json.dumps(r, sort_keys=True, default=str) for r in rows.to_pylist())
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _consume(table: str) -> str:
    """Read everything; a digest of what was read (snapshot version, rows, change rows)."""
    import deltastream as ds

    snapshot = ds.read_snapshot(table)
    rows = ds.read_rows(table).read_all()
    changes = ds.read_changes(
        table, start_version=0, infer_without_cdf=True, allow_empty_range=True
    ).read_all()
    return f"{snapshot.version}:{_rows_digest(rows)}:{_rows_digest(changes)}"


def _kernel_agrees(table: str) -> tuple[bool, str]:
    """Whether delta-kernel-rs reads the same rows from ``table`` as deltastream (which read
    it without error), and if not, why."""
    import delta_kernel_rust_sharing_wrapper as kernel

    import deltastream as ds

    ours = _rows_digest(ds.read_rows(table).read_all())
    uri = Path(table).resolve().as_uri() + "/"
    try:
        engine = kernel.PythonInterface(uri)
        snapshot = kernel.Table(uri).snapshot(engine)
        theirs = kernel.ScanBuilder(snapshot).build().execute(engine).read_all()
    except BaseException as e:  # a Rust panic is a BaseException
        return False, f"delta-kernel-rs refuses it: {type(e).__name__}: {str(e)[:200]}"
    if _rows_digest(theirs) == ours:
        return True, ""
    return False, f"delta-kernel-rs reads other rows ({theirs.num_rows} rows)"


_BASELINES: dict[str, str] = {}


def _baseline(item: Input) -> str:
    """The digest of the unmutated table (computed once per table and worker process)."""
    if item.table not in _BASELINES:
        with tempfile.TemporaryDirectory() as tmp:
            table = Path(tmp) / "t"
            shutil.copytree(_source(item.table), table)
            _BASELINES[item.table] = _consume(str(table))
    return _BASELINES[item.table]


def run_one(item: Input, queue: Any) -> None:
    """Worker body: materialise, consume, report (outcome, detail)."""
    import logging

    logging.disable(logging.WARNING)  # fallbacks warn: the outcome is what counts here
    with tempfile.TemporaryDirectory() as tmp:
        table, what = materialise(item, Path(tmp))
        from deltastream.errors import DeltaStreamError

        try:
            if _consume(str(table)) == _baseline(item):
                queue.put(("ok", what, ""))
            else:
                agrees, why = _kernel_agrees(str(table))
                queue.put(("ok-different" if agrees else "ok-disputed", what, why))
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
    write_tables()
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
    parser.add_argument("--review", action="store_true", help="also list ok-disputed inputs")
    args = parser.parse_args(argv)
    if args.replay:
        seed, index = map(int, args.replay.split(":"))
        write_tables()
        item = make_input(seed, index)
        outcome, what, detail = run_input(item, mp.get_context("forkserver"))
        print(f"{item.ref} {item.table}/{item.file} ({what}): {outcome}\n{detail}")
        return 0
    started = time.monotonic()
    findings: list[str] = []
    review: list[str] = []

    def report(item: Input, outcome: str, what: str, detail: str) -> None:
        line = f"--- {outcome} {item.ref}: {item.table}/{item.file} ({what})\n{detail}"
        if outcome in FINDINGS:
            findings.append(line)
        elif outcome in REVIEW:
            review.append(line)

    counts = campaign(args.seed, args.inputs, args.jobs, report)
    elapsed = time.monotonic() - started
    print(
        f"inputs {args.inputs} (seed {args.seed}, {args.jobs} jobs, {elapsed:.0f} s): "
        + ", ".join(f"{k} {counts[k]}" for k in OUTCOMES)
    )
    for line in review if args.review else ():
        print(line)
    for finding in findings:
        print(finding)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
