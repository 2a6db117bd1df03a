"""``IncrementalState``: one commit at a time, it must give exactly what ``LogState.apply``
gives (random logs with every reconciliation corner, and every corpus table), while its
memory stays columnar."""

from __future__ import annotations

import json
import random
import threading
import tracemalloc
from dataclasses import replace
from typing import Any
from urllib.parse import quote

import anyio
import logbuilder as lb
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from corpus import CorpusTable, corpora_cases, corpus_tables

import deltastream as ds
from deltastream.log.commit import LogActions, parse_commit
from deltastream.log.listing import list_log
from deltastream.snapshot.incremental import IncrementalState, _FileChanges
from deltastream.snapshot.loader import load_table_state, read_log_files
from deltastream.snapshot.reconcile import FILES_SCHEMA, CommitBatch, LogState
from deltastream.storage.local import LocalStore

LOCAL_ROOT = "/data/tbl"
S3_ROOT = "s3://bucket/tbl"


def commit(*actions: dict[str, Any], n: int = 0) -> LogActions:
    data = "".join(json.dumps(a) + "\n" for a in actions).encode()
    return parse_commit(f"_delta_log/{n:020d}.json", data)


def dv_uid(dv: dict[str, Any] | None) -> str | None:
    if dv is None:
        return None
    off = dv.get("offset")
    return f"{dv['storageType']}{dv['pathOrInlineDv']}" + ("" if off is None else f"@{off}")


def assert_same(inc: IncrementalState, ref: LogState) -> None:
    """Equal to ``ref`` row for row (order included), and in every other field."""
    got = inc.to_log_state()
    assert got.table_root == ref.table_root
    assert got.files.equals(ref.files), (
        got.files.column("path").to_pylist(),
        ref.files.column("path").to_pylist(),
    )
    assert got.tombstones.equals(ref.tombstones), (
        got.tombstones.column("path").to_pylist(),
        ref.tombstones.column("path").to_pylist(),
    )
    assert got.protocol == ref.protocol
    assert got.metadata == ref.metadata
    assert dict(got.txns) == dict(ref.txns) == dict(inc.txns)
    assert dict(got.domains) == dict(ref.domains) == dict(inc.domains)
    assert dict(inc.live_domains) == dict(ref.live_domains)
    assert got.last_commit_info == ref.last_commit_info
    assert inc.num_files == ref.files.num_rows
    assert inc.size_bytes == (pc.sum(ref.files.column("size")).as_py() or 0)
    assert inc.num_tombstones == ref.tombstones.num_rows


# --- random logs ---------------------------------------------------------------------------

DVS: list[dict[str, Any] | None] = [
    None,
    {"storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^", "offset": 1,
     "sizeInBytes": 40, "cardinality": 2},
    {"storageType": "u", "pathOrInlineDv": "zz^-aqEH.-t@S}K{vb[*k^", "offset": 1,
     "sizeInBytes": 40, "cardinality": 3},
    {"storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^", "offset": 77,
     "sizeInBytes": 40, "cardinality": 4},
    lb.inline_dv(),
    {"storageType": "p", "pathOrInlineDv": "s3://bucket/dv/one.bin", "offset": 4,
     "sizeInBytes": 40, "cardinality": 1},
]  # fmt: skip

#: Partition directories as the logical (decoded) name: spaces, non-ASCII, a literal '%'.
PARTS = ["a", "b c", "é", "100%", "日本"]


class LogGenerator:
    """Random commits over a small universe of logical files, so that actions collide:
    adds, removes, re-adds, DV updates, duplicates within a commit, and every spelling of
    a path (relative encoded or raw, absolute under the root, absolute elsewhere)."""

    def __init__(self, rng: random.Random, root: str, n_files: int = 14) -> None:
        self.rng = rng
        self.root = root
        self.names = [
            (PARTS[i % len(PARTS)], f"part={PARTS[i % len(PARTS)]}/f{i}.parquet")
            for i in range(n_files)
        ]
        self.live: list[tuple[int, int]] = []  # (name index, dv index) probably live
        self.clock = 1_700_000_000_000
        #: How often a path is spelled absolutely: rarely, or never, keeps the state free
        #: of absolute paths for a while, so that raw (as written) comparisons are tested.
        self.absolute_rate = rng.choice([0.0, 0.03, 0.3])

    def spell(self, name: str) -> str:
        """One of the ways a log may write the path of logical file ``name``."""
        rng = self.rng
        encoded = quote(name)
        if rng.random() >= self.absolute_rate:
            # Unencoded, as some writers do (differs when the name has ' ' or '%').
            return encoded if rng.random() < 0.75 else name
        if rng.random() < 0.85:
            if self.root.startswith("s3://"):
                rest = self.root[len("s3://") :]
                return rng.choice(["s3://", "s3a://"]) + f"{rest}/{encoded}"
            spellings = ["file:", "file://", ""]
            return f"{rng.choice(spellings)}{self.root}/{encoded}"
        return rng.choice(["file:/elsewhere/", "s3://other/t/"]) + encoded

    def add(self, i: int, d: int) -> dict[str, Any]:
        part, name = self.names[i]
        action = lb.add(
            self.spell(name),
            size=self.rng.randint(1, 10_000),
            part=part,
            dv=DVS[d],
            stats=json.dumps({"numRecords": self.rng.randint(0, 99)}),
        )
        action["add"]["modificationTime"] = self.clock
        self.live.append((i, d))
        return action

    def remove(self, i: int, d: int) -> dict[str, Any]:
        action = lb.remove(self.spell(self.names[i][1]), dv=DVS[d])
        stamp = self.rng.choice([None, self.clock - self.rng.randint(0, 50_000)])
        action["remove"]["deletionTimestamp"] = stamp
        if self.rng.random() < 0.5:
            action["remove"]["size"] = self.rng.randint(1, 10_000)
        return action

    def pick(self) -> tuple[int, int]:
        if self.live and self.rng.random() < 0.75:
            return self.rng.choice(self.live)
        return self.rng.randrange(len(self.names)), self.rng.randrange(len(DVS))

    def commit(self, version: int) -> LogActions:
        rng = self.rng
        self.clock += 60_000
        actions: list[dict[str, Any]] = []
        if version == 0 or rng.random() < 0.1:
            actions.append(lb.protocol(3, 7, ["deletionVectors"], ["deletionVectors"]))
        if version == 0 or rng.random() < 0.1:
            actions.append(
                lb.metadata(configuration={"k": str(rng.randint(0, 9))}, partition_columns=[])
            )
        if rng.random() < 0.3:
            actions.append(lb.txn(rng.choice(["app-1", "app-2", "app-3"]), version))
        if rng.random() < 0.2:
            domain = {
                "domain": rng.choice(["d1", "d2", "delta.clustering"]),
                "configuration": json.dumps({"v": version}),
                "removed": rng.random() < 0.3,
            }
            actions.append({"domainMetadata": domain})
        if rng.random() < 0.85:
            actions.append(lb.commit_info(timestamp=self.clock))
        file_actions: list[dict[str, Any]] = []
        for _ in range(rng.choice([0, 1, 2, 3, 5, 8])):
            kind = rng.random()
            if kind < 0.4:
                file_actions.append(self.add(*self.pick()))
            elif kind < 0.7:
                i, d = self.pick()
                file_actions.append(self.remove(i, d))
                if (i, d) in self.live:
                    self.live.remove((i, d))
            elif kind < 0.85:  # DV update: remove (path, dvA) + add (path, dvB)
                i, d = self.pick()
                file_actions.append(self.remove(i, d))
                file_actions.append(self.add(i, rng.randrange(len(DVS))))
            elif file_actions:  # the same logical file again in this commit
                file_actions.append(json.loads(json.dumps(rng.choice(file_actions))))
        if not actions and not file_actions:
            actions.append(lb.txn("app-1", version))  # a commit is never empty
        rng.shuffle(actions)
        return commit(*actions, *file_actions, n=version)


def expected_lookup(ref: LogState, path: str, dv: dict[str, Any] | None) -> dict[str, Any] | None:
    """The live add that a remove of (path, dv) would remove now (the newest, if several)."""
    after = ref.apply([commit(lb.remove(path, dv=dv))])
    if ref.files.num_rows == after.files.num_rows:
        return None
    kept = {json.dumps(r, sort_keys=True) for r in after.files.to_pylist()}
    dropped = [r for r in ref.files.to_pylist() if json.dumps(r, sort_keys=True) not in kept]
    return dropped[-1]


def run_random_log(seed: int) -> None:
    rng = random.Random(seed)
    root = rng.choice([LOCAL_ROOT, LOCAL_ROOT, S3_ROOT])
    gen = LogGenerator(rng, root)
    n_commits = rng.randint(10, 40)
    commits = [gen.commit(v) for v in range(n_commits)]
    start = rng.randrange(n_commits)
    ref = LogState(table_root=root)
    for c in commits[: start + 1]:
        ref = ref.apply([c])
    background = rng.random() < 0.3
    inc = IncrementalState.from_log_state(
        ref,
        start,
        compact_min_rows=rng.choice([0, 1, 3, 10_000]),
        compact_fraction=rng.choice([0.0, 0.05, 0.5]),
        auto_compact=not background,
    )
    assert_same(inc, ref)
    job = None
    for v in range(start + 1, n_commits):
        inc.apply(v, commits[v])
        ref = ref.apply([commits[v]])
        assert inc.version == v
        assert_same(inc, ref)
        if rng.random() < 0.15:
            cutoff = gen.clock - rng.randint(0, 100_000)
            stamps = ref.tombstones.column("deletionTimestamp")
            keep = pc.invert(pc.fill_null(pc.less(stamps, cutoff), False))
            expired = ref.tombstones.num_rows - (pc.sum(keep.cast(pa.int64())).as_py() or 0)
            assert inc.expire_tombstones(cutoff) == expired
            ref = replace(ref, tombstones=ref.tombstones.filter(keep))
            assert_same(inc, ref)
        for _ in range(2):
            i, d = gen.pick()
            path = gen.spell(gen.names[i][1])
            assert inc.lookup(path, dv_uid(DVS[d])) == expected_lookup(ref, path, DVS[d])
        if background:
            # Rebuild off the "event loop", while commits keep arriving.
            if job is None and rng.random() < 0.3:
                job = inc.prepare_compaction(force=rng.random() < 0.5)
                if rng.random() < 0.5:
                    worker = threading.Thread(target=job.run)
                    worker.start()
                    worker.join()
            elif job is not None and rng.random() < 0.5:
                assert inc.finish_compaction(job)
                job = None
                assert_same(inc, ref)
    if job is not None:
        assert inc.finish_compaction(job)
    inc.compact(force=True)
    assert_same(inc, ref)
    assert inc.stats()["files_delta_rows"] == inc.stats()["files_dead_base_rows"] == 0


@pytest.mark.parametrize("seed", range(150))
def test_random_logs_match_log_state(seed: int) -> None:
    run_random_log(seed)


@pytest.mark.parametrize("seed", range(300))
def test_commit_winners_are_commit_batch_winners(seed: int) -> None:
    """One commit's winners are CommitBatch's (the newest action per key, in log order)."""
    rng = random.Random(seed)
    root = rng.choice([LOCAL_ROOT, S3_ROOT])
    gen = LogGenerator(rng, root, n_files=5)
    c = gen.commit(1)
    changes = _FileChanges.of(c.file_actions, root)
    batch = CommitBatch([c], root)
    if changes is None:
        assert batch.is_empty
        return
    rows = changes.winners
    assert changes.adds.take(pa.array(changes.add_rows, pa.int64())).to_pylist() == (
        batch.winners.column("add").drop_null().to_pylist()
    )
    assert changes.removes.take(pa.array(changes.remove_rows, pa.int64())).to_pylist() == (
        batch.winners.column("remove").drop_null().to_pylist()
    )
    assert len(rows) == batch.winners.num_rows
    assert c.file_actions.take(pa.array(rows, pa.int64())).equals(batch.winners)


# --- hand-written cases --------------------------------------------------------------------


def test_state_with_absolute_path_then_relative_commit() -> None:
    """A state holding an absolute path canonicalises keys for a commit that has none (the
    _has_absolute rule applies to the state too); LogState used to crash here."""
    c0 = commit(lb.add(f"file:{LOCAL_ROOT}/a%20b.parquet"), lb.add("c.parquet"))
    c1 = commit(lb.remove("a b.parquet"), lb.add("d.parquet"))
    ref = LogState(table_root=LOCAL_ROOT).apply([c0])
    inc = IncrementalState.from_log_state(ref, 0)
    inc.apply(1, c1)
    ref = ref.apply([c1])
    assert sorted(ref.files.column("path").to_pylist()) == ["c.parquet", "d.parquet"]
    assert_same(inc, ref)
    # Once the absolute path is gone, paths compare as written again.
    c2 = commit(lb.add("e%20f.parquet"))
    c3 = commit(lb.remove("e f.parquet"))
    for v, c in ((2, c2), (3, c3)):
        inc.apply(v, c)
        ref = ref.apply([c])
        assert_same(inc, ref)
    assert "e%20f.parquet" in ref.files.column("path").to_pylist()


def test_lookup() -> None:
    dv = DVS[1]
    c0 = commit(
        lb.add("part=a/x%20y.parquet", size=10),
        lb.add("part=a/z.parquet", size=20, dv=dv),
        lb.add("part=a/z.parquet", size=30),
    )
    inc = IncrementalState.from_log_state(LogState(table_root=LOCAL_ROOT).apply([c0]), 0)
    row = inc.lookup("part=a/x%20y.parquet")
    assert row is not None and row["size"] == 10 and row["partitionValues"] == [("part", "a")]
    found = inc.lookup("part=a/z.parquet", dv_uid(dv))
    assert found is not None and found["size"] == 20
    found = inc.lookup("part=a/z.parquet")
    assert found is not None and found["size"] == 30
    assert inc.lookup("part=a/z.parquet", "uother@1") is None
    assert inc.lookup("part=a/nope.parquet") is None
    # Spelled absolutely, the path is canonicalised as a remove's would be.
    found = inc.lookup(f"file://{LOCAL_ROOT}/part=a/x%20y.parquet")
    assert found is not None and found["size"] == 10
    # Without absolute paths in play, paths compare as written (as LogState does).
    assert inc.lookup("part=a/x y.parquet") is None
    inc.apply(1, commit(lb.add("part=a/new.parquet", size=40)))  # found in the delta
    found = inc.lookup("part=a/new.parquet")
    assert found is not None and found["size"] == 40
    inc.apply(2, commit(lb.remove("part=a/z.parquet", dv=dv)))
    assert inc.lookup("part=a/z.parquet", dv_uid(dv)) is None
    assert inc.num_files == 3 and inc.size_bytes == 80


def test_expire_tombstones() -> None:
    def remove(path: str, stamp: int | None) -> dict[str, Any]:
        return {"remove": {"path": path, "deletionTimestamp": stamp, "dataChange": True}}

    c0 = commit(*(lb.add(f"f{i}.parquet") for i in range(4)))
    c1 = commit(*(remove(f"f{i}.parquet", t) for i, t in enumerate((10, 20, None, 40))))
    base = LogState(table_root=LOCAL_ROOT).apply([c0, c1])
    inc = IncrementalState.from_log_state(base, 1, compact_min_rows=1000)
    assert inc.num_tombstones == 4
    assert inc.expire_tombstones(15) == 1  # base rows
    inc.apply(2, commit(lb.add("g.parquet"), remove("h.parquet", 5)))
    assert inc.expire_tombstones(30) == 2  # f1 (base), h (delta); f2 has no timestamp
    assert sorted(inc.to_log_state().tombstones.column("path").to_pylist()) == [
        "f2.parquet",
        "f3.parquet",
    ]
    assert inc.expire_tombstones(30) == 0
    assert inc.expire_tombstones(10**15) == 1  # f3; f2 is kept forever
    assert inc.num_tombstones == 1


def test_versions_must_follow_each_other() -> None:
    inc = IncrementalState.from_log_state(
        LogState(table_root=LOCAL_ROOT).apply([commit(lb.add("a.parquet"))]), 5
    )
    before = inc.to_log_state()
    for bad in (5, 7, 0):
        with pytest.raises(ds.InvalidArgumentError, match="the next is 6"):
            inc.apply(bad, commit(lb.remove("a.parquet")))
    assert inc.version == 5
    assert_same(inc, before)
    with pytest.raises(ValueError):  # InvalidArgumentError is a ValueError
        inc.apply(4, commit(lb.remove("a.parquet")))
    inc.apply(6, commit(lb.remove("a.parquet")))
    assert inc.version == 6 and inc.num_files == 0
    with pytest.raises(ds.InvalidArgumentError):
        IncrementalState.from_log_state(LogState(table_root=LOCAL_ROOT), -1)


def test_abandoned_compaction_job_is_ignored() -> None:
    ref = LogState(table_root=LOCAL_ROOT).apply([commit(lb.add("a.parquet"))])
    inc = IncrementalState.from_log_state(ref, 0, auto_compact=False)
    first = inc.prepare_compaction(force=True)
    second = inc.prepare_compaction(force=True)
    c = commit(lb.add("b.parquet"), lb.remove("a.parquet"))
    inc.apply(1, c)
    ref = ref.apply([c])
    assert not inc.finish_compaction(first)
    assert inc.finish_compaction(second)  # runs it, then replays commit 1
    assert_same(inc, ref)
    assert not inc.finish_compaction(second)


def synthetic_state(n: int, root: str = LOCAL_ROOT) -> LogState:
    """``n`` live files built as Arrow columns (no Python object per file)."""
    idx = pa.array(range(n), pa.int64())
    part = pc.cast(pc.bit_wise_and(idx, pa.scalar(31, pa.int64())), pa.string())
    path = pc.binary_join_element_wise(
        "part=", part, "/part-", pc.cast(idx, pa.string()), "-c000.snappy.parquet", ""
    )
    files = pa.table(
        {
            "path": path,
            "partitionValues": pa.MapArray.from_arrays(
                pa.array(range(0, n + 1), pa.int32()), pa.array(["part"] * n), part
            ),
            "size": pc.add(idx, pa.scalar(1000, pa.int64())),
            "modificationTime": idx,
            "dataChange": pa.array([True] * n),
        }
    )
    columns = [
        files.column(f.name) if f.name in files.column_names else pa.nulls(n, f.type)
        for f in FILES_SCHEMA
    ]
    return LogState(table_root=root, files=pa.Table.from_arrays(columns, schema=FILES_SCHEMA))


def test_memory_stays_columnar() -> None:
    """Python allocations (numpy included; Arrow's own pool is not traced) stay at a few
    bytes per file: no Python object per file."""
    n = 200_000
    state = synthetic_state(n)
    tracemalloc.start()
    try:
        inc = IncrementalState.from_log_state(state, 0)
        for v in range(1, 21):
            inc.apply(
                v,
                commit(
                    *(lb.add(f"part=new/{v}-{i}.parquet") for i in range(5)),
                    *(
                        lb.remove(f"part={j % 32}/part-{j}-c000.snappy.parquet")
                        for j in range(v * 1000, v * 1000 + 5)
                    ),
                ),
            )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert inc.num_files == n
    assert peak / n < 32, f"{peak / n:.0f} bytes of Python allocations per file"


def test_non_ascii_keys_sort_as_python_compares_them() -> None:
    """The binary search compares UTF-8 bytes, as Arrow's sort orders them."""
    names = ["Z", "a", "é", "z", "中", "😀", "ab", "a%20b", "a b", ""]
    c0 = commit(*(lb.add(f"{n}.parquet") for n in names))
    inc = IncrementalState.from_log_state(LogState(table_root=LOCAL_ROOT).apply([c0]), 0)
    for n in names:
        found = inc.lookup(f"{n}.parquet")
        assert found is not None and found["path"] == f"{n}.parquet"


# --- corpora -------------------------------------------------------------------------------


def row_set(table: pa.Table) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in table.to_pylist())


def logical_files(table: pa.Table, *fields: str) -> list[tuple[Any, ...]]:
    """(path, DV unique id, *fields) of each row, sorted: what a checkpoint and the commits
    it summarises agree on (a checkpoint may spell other fields differently, e.g. ``tags``
    as an empty map where the commit had none)."""
    rows = table.select(["path", "deletionVector", *fields]).to_pylist()
    return sorted(
        ((r["path"], dv_uid(r["deletionVector"]), *(r[f] for f in fields)) for r in rows),
        key=repr,
    )


#: Fixtures whose checkpoint does not summarise their commits: its metaData comes from
#: another table (other id, schema and configuration), for kernel-rs's skipping tests.
FOREIGN_CHECKPOINT = {"delta-kernel-rs/data/parquet_row_group_skipping"}


async def check_corpus_table(table: CorpusTable, configure: dict[str, Any]) -> int:
    """For a few start versions k: apply commits k+1..latest one by one to the state loaded
    at k; the result must equal ``LogState.apply`` of the same commits row for row, and
    agree with the state loaded at the latest version. Returns how many k were compared."""
    async with LocalStore(str(table.location)) as store:
        return await replay_corpus_table(store, table, configure)


async def replay_corpus_table(
    store: LocalStore, table: CorpusTable, configure: dict[str, Any]
) -> int:
    latest, segment = await load_table_state(store, files=True)
    last = segment.version
    commits = (await list_log(store, 0)).commits()
    starts = sorted({min(commits, default=last), last // 2, last - 3, last - 1, last})
    compared = 0
    for k in (k for k in starts if 0 <= k <= last):
        if any(v not in commits for v in range(k + 1, last + 1)):
            continue
        try:
            ref, _ = await load_table_state(store, k, files=True)
        except ds.DeltaStreamError:
            continue  # the log cannot reconstruct k (e.g. cleaned up before a checkpoint)
        actions = await read_log_files(store, [commits[v] for v in range(k + 1, last + 1)])
        inc = IncrementalState.from_log_state(ref, k, **configure)
        for v, a in enumerate(actions, k + 1):
            inc.apply(v, a)
            ref = ref.apply([a])
        assert_same(inc, ref)
        got = inc.to_log_state()
        assert logical_files(got.files, "size") == logical_files(latest.files, "size"), k
        # A checkpoint may have dropped expired tombstones.
        assert set(logical_files(got.tombstones)) >= set(logical_files(latest.tombstones)), k
        assert got.protocol == latest.protocol
        assert got.metadata is not None and latest.metadata is not None
        if table.path not in FOREIGN_CHECKPOINT:
            # A checkpoint may re-serialise the schema (other whitespace).
            assert json.loads(got.metadata.schema_string or "null") == json.loads(
                latest.metadata.schema_string or "null"
            )
            assert replace(got.metadata, schema_string=None) == replace(
                latest.metadata, schema_string=None
            )
        assert dict(got.txns) == dict(latest.txns)
        assert dict(got.live_domains) == dict(latest.live_domains)
        for row in got.files.to_pylist()[:20]:
            assert inc.lookup(row["path"], dv_uid(row["deletionVector"])) == row
        compared += 1
    return compared


@pytest.mark.parametrize("table", corpus_tables(), ids=str)
def test_corpus_tables_replay_incrementally(table: CorpusTable) -> None:
    error = corpora_cases().expected_error(table)
    if error is not None:  # test_corpora checks why deltastream refuses it
        with pytest.raises(error):
            anyio.run(check_corpus_table, table, {})
        return
    configs: list[dict[str, Any]] = [{}, {"compact_min_rows": 1, "compact_fraction": 0.0}]
    for configure in configs:
        assert anyio.run(check_corpus_table, table, configure) >= 1
