"""The three consumers of the change data feed agree, table by table and range by range.

deltastream applies the Delta protocol's per-commit rules (which actions give change rows,
whether the feed was in force, schema changes, ``_commit_timestamp``) in three places:

* change ranges: ``deltastream.read_changes(uri, start_version=, end_version=)``;
* the tailer: a :class:`deltastream.Tailer` in ``follow`` mode from the start version, with
  a collecting sink, stopped once its position is past the end version;
* the Spark source: a batch ``readChangeFeed`` read with ``startingVersion`` and
  ``endingVersion``, and a ``Trigger.AvailableNow`` stream with ``readChangeFeed`` and
  ``startingVersion`` (rows after the end version dropped).

For every table and range below, all four give the same multiset of rows, every column
included (``_commit_timestamp`` too), or all refuse with the same error class (and, for
``ChangeDataNotEnabledError``, the same versions). The tables: every expected-cdf corpus case
(../shared/corpora/expected-cdf) at its range, and tables deltalake writes here: appends,
updates, deletes and merges; the feed turned off and on again; an additive schema change;
a protocol upgrade without the ``changeDataFeed`` writer feature; in-commit timestamps
enabled from version 2 (and turned off again at version 4); commits with equal (and
decreasing) file modification times.

Spark costs most: every streaming source starts a Python process of its own (~2-3 s here),
so the Spark work for all cases is done once, up front, by a module fixture (batch reads and
streams one after another, one stream per table and start version); the tests then compare
per case. Streams run one at a time: several starting at once on a busy two-core machine
made Spark give up on their Python processes ("Python worker failed to connect back").
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import itertools
import json
import math
import os
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from cdf_tables import upgraded_without_cdf_feature
from conftest import CORPORA
from deltalake import DeltaTable, write_deltalake

import deltastream as ds
from deltastream import errors as ds_errors
from deltastream.daemon.stream.tailer import Mode, StartFrom, TailConfig, Tailer

sys.path.insert(0, str(Path(__file__).resolve().parent / "daemon"))
from tailing import Collector, eventually, fast

# --- the cases ------------------------------------------------------------------------------

CDF = {"delta.enableChangeDataFeed": "true"}
EXPECTED = CORPORA / "expected-cdf"
#: The expected-cdf case whose delta-rs test filtered rows with a partition predicate: the
#: consumers do not all take predicates, and its table and range are another case's.
PREDICATE_CASES = {"delta-rs__cdf_partition_predicate_keeps_matching_rows__0.json"}
#: As in tests/changes/test_cdf_corpora.py: delta-rs picked this range by commitInfo times.
RANGES = {"delta-rs__test_respect_ict__0.json": (2, None)}


@dataclass(frozen=True)
class Case:
    """A table (a corpus path, or the name of a table the ``tables`` fixture writes) and an
    inclusive version range (``end=None``: the latest version)."""

    id: str
    table: str
    start: int
    end: int | None
    #: Every consumer refuses with ChangeDataNotEnabledError naming these versions.
    refused: tuple[int, ...] | None = None
    #: Ask every consumer to infer changes (inferWithoutCdf in Spark).
    infer: bool = False


def corpus_cases() -> list[Case]:
    cases: dict[tuple[str, int, int | None], Case] = {}
    files = sorted(EXPECTED.glob("*.json"))
    assert len(files) >= 15, f"expected-cdf cases not found under {EXPECTED}"
    for path in files:
        if path.name in PREDICATE_CASES:
            continue
        spec = json.loads(path.read_text())
        start, end = RANGES.get(path.name, (spec["start_version"], spec["end_version"]))
        if "datetime" in path.name:
            # Selected by an end timestamp in delta-rs: the versions its rows span.
            index = spec["columns"].index("_commit_version")
            versions = [int(r[index]) for r in spec["rows"]]
            start, end = min(versions), max(versions)
        key = (spec["table"], start, end)
        if key not in cases:  # several tests of one table and range: one case
            name = path.name.removesuffix(".json")
            cases[key] = Case(f"corpus:{name}", str(CORPORA / spec["table"]), start, end)
    return list(cases.values())


WRITTEN_CASES = [
    Case("history:0-latest", "history", 0, None),
    Case("history:2-5", "history", 2, 5),
    Case("history:6-6", "history", 6, 6),
    Case("toggled:0-4", "toggled", 0, 4, refused=(2,)),
    Case("toggled:0-4-inferred", "toggled", 0, 4, infer=True),
    Case("toggled:2-4", "toggled", 2, 4, refused=(2,)),
    Case("toggled:3-4", "toggled", 3, 4),
    # From version 0 (whose metaData has the narrower schema) or later, every consumer reads
    # across the additive change: read_changes and Spark with the latest schema, the tailer
    # going on with the new one (its earlier rows lack the column, compared as null).
    Case("additive:0-4", "additive", 0, 4),
    Case("additive:1-4", "additive", 1, 4),
    Case("additive:3-4", "additive", 3, 4),
    Case("upgraded:0-latest", "upgraded", 0, None, refused=(2,)),
    Case("upgraded:2-latest", "upgraded", 2, None, refused=(2,)),
    Case("ict-enabled:0-latest", "ict_enabled", 0, None),
    Case("ict-toggled:0-latest", "ict_toggled", 0, None),
    Case("ict-toggled:3-latest", "ict_toggled", 3, None),
    Case("same-mtime:0-latest", "same_mtime", 0, None),
    Case("same-mtime:2-latest", "same_mtime", 2, None),
]


ALL_CASES = corpus_cases() + WRITTEN_CASES


# --- the tables deltalake writes ------------------------------------------------------------


def people(ids: Sequence[int], tag: str) -> pa.Table:
    """Rows with the types whose rendering is easy to get wrong: decimal, timestamp, date."""
    base = dt.datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"{tag}{i}" for i in ids]),
            "amount": pa.array([decimal.Decimal(i * 25) / 100 for i in ids], pa.decimal128(10, 2)),
            "seen": pa.array([base + dt.timedelta(days=i, microseconds=i) for i in ids]),
            "day": pa.array([dt.date(2026, 1, 1) + dt.timedelta(days=i) for i in ids]),
            "part": pa.array([f"p{i % 3}" for i in ids]),
        }
    )


def merge(uri: str, source: pa.Table, *, delete_matched: str | None = None) -> None:
    builder = DeltaTable(uri).merge(
        source, predicate="t.id = s.id", source_alias="s", target_alias="t"
    )
    if delete_matched is not None:
        builder = builder.when_matched_delete(predicate=delete_matched)
    builder.when_matched_update_all().when_not_matched_insert_all().execute()


def write_history(uri: str) -> None:
    """v0 create (partitioned, CDF on); v1 append; v2 update; v3 delete; v4 merge (updates
    and inserts); v5 merge deleting some matches; v6 a delete of a whole partition."""
    write_deltalake(uri, people(range(9), "a"), partition_by=["part"], configuration=CDF)
    write_deltalake(uri, people(range(9, 12), "b"), mode="append")
    DeltaTable(uri).update(predicate="id % 4 = 1", updates={"name": "concat(name, '+')"})
    DeltaTable(uri).delete("id = 3 OR id = 10")
    merge(uri, people([0, 1, 20, 21], "m"))
    merge(uri, people([2, 4, 22], "n"), delete_matched="s.id = 2")
    DeltaTable(uri).delete("part = 'p2'")
    assert DeltaTable(uri).version() == 6


def write_toggled(uri: str) -> None:
    """v0 create with CDF; v1 CDF off; v2 delete (no cdc files); v3 CDF on; v4 update."""
    write_deltalake(uri, people(range(6), "a"), configuration=CDF)
    DeltaTable(uri).alter.set_table_properties({"delta.enableChangeDataFeed": "false"})
    DeltaTable(uri).delete("id < 2")
    DeltaTable(uri).alter.set_table_properties(CDF)
    DeltaTable(uri).update(predicate="id = 4", updates={"name": "'u'"})
    assert DeltaTable(uri).version() == 4
    assert '"cdc"' not in (Path(uri) / "_delta_log" / f"{2:020d}.json").read_text()


def write_additive(uri: str) -> None:
    """v0 create (id, v); v1 append; v2 append adding column ``extra``; v3 update; v4 delete."""
    write_deltalake(uri, pa.table({"id": pa.array([0, 1, 2], pa.int64()), "v": ["a"] * 3}),
                    configuration=CDF)  # fmt: skip
    write_deltalake(uri, pa.table({"id": pa.array([3], pa.int64()), "v": ["b"]}), mode="append")
    wider = pa.table(
        {"id": pa.array([4], pa.int64()), "v": ["c"], "extra": pa.array([40], pa.int64())}
    )
    write_deltalake(uri, wider, mode="append", schema_mode="merge")
    DeltaTable(uri).update(predicate="id = 1", updates={"v": "'u'", "extra": "7"})
    DeltaTable(uri).delete("id = 0")
    assert DeltaTable(uri).version() == 4


#: Modification times for the same-mtime table's commits (epoch seconds): versions 1 and 2
#: share one; version 3's is even earlier than theirs (clock skew); version 4 is later.
SAME_MTIMES = {0: 1_790_000_000.0, 1: 1_790_000_100.5, 2: 1_790_000_100.5, 3: 1_790_000_050.25,
               4: 1_790_000_200.0}  # fmt: skip


def write_same_mtime(uri: str) -> None:
    write_deltalake(uri, people(range(5), "a"), configuration=CDF)
    write_deltalake(uri, people([5, 6], "b"), mode="append")
    DeltaTable(uri).update(predicate="id = 1", updates={"name": "'u'"})
    DeltaTable(uri).delete("id = 2")
    write_deltalake(uri, people([7], "c"), mode="append")
    log = Path(uri) / "_delta_log"
    for version, seconds in SAME_MTIMES.items():
        os.utime(log / f"{version:020d}.json", (seconds, seconds))


def rewrite_commit(uri: str, version: int, edit: Callable[[list[dict[str, Any]]], None]) -> None:
    path = Path(uri) / "_delta_log" / f"{version:020d}.json"
    actions = [json.loads(line) for line in path.read_text().splitlines() if line]
    edit(actions)
    path.write_text("".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions))


#: In-commit timestamps and file times (epoch ms) of the ICT tables' commits: the in-commit
#: timestamps differ from the file times, so a consumer using the wrong one shows.
ICT_FILE_MS = {v: 1_790_000_000_000 + 100_000 * v for v in range(6)}
ICT_MS = {2: 1_790_000_250_500, 3: 1_790_000_360_750, 4: 1_790_000_470_001, 5: 1_790_000_555_555}


def write_ict(uri: str, *, disable_at_4: bool) -> None:
    """In-commit timestamps enabled at version 2 (deltalake cannot write them: its commits
    are edited afterwards, as a writer enabling the feature would have written them).

    v0 create (CDF on); v1 append; v2 append, enabling in-commit timestamps (protocol
    (1, 7) with ``inCommitTimestamp`` and ``changeDataFeed``; enablement version 2); v3
    update; v4 append (with ``disable_at_4``: turning in-commit timestamps off, the
    enablement properties removed); v5 delete. Versions 2 and 3 carry in-commit timestamps,
    and 4 and 5 too unless they were turned off.
    """
    write_deltalake(uri, people(range(6), "a"), configuration=CDF)
    write_deltalake(uri, people([6, 7], "b"), mode="append")
    write_deltalake(uri, people([8], "c"), mode="append")
    DeltaTable(uri).update(predicate="id = 1", updates={"name": "'u'"})
    write_deltalake(uri, people([9], "d"), mode="append")
    DeltaTable(uri).delete("id = 2")
    log = Path(uri) / "_delta_log"
    (metadata,) = [
        a["metaData"]
        for a in map(json.loads, (log / f"{0:020d}.json").read_text().splitlines())
        if "metaData" in a
    ]

    def with_config(**config: str) -> dict[str, Any]:
        return {"metaData": {**metadata, "configuration": {**CDF, **config}}}

    def stamp(ict: int) -> Callable[[dict[str, Any]], None]:
        def edit(info: dict[str, Any]) -> None:
            info["inCommitTimestamp"] = ict
            info["timestamp"] = ict

        return edit

    def enable(actions: list[dict[str, Any]]) -> None:
        assert "commitInfo" in actions[0]
        stamp(ICT_MS[2])(actions[0]["commitInfo"])
        features = ["appendOnly", "changeDataFeed", "inCommitTimestamp", "invariants"]
        actions[1:1] = [
            {"protocol": {"minReaderVersion": 1, "minWriterVersion": 7,
                          "writerFeatures": features}},
            with_config(**{
                "delta.enableInCommitTimestamps": "true",
                "delta.inCommitTimestampEnablementVersion": "2",
                "delta.inCommitTimestampEnablementTimestamp": str(ICT_MS[2]),
            }),
        ]  # fmt: skip

    rewrite_commit(uri, 2, enable)
    if disable_at_4:
        disable = with_config(**{"delta.enableInCommitTimestamps": "false"})
        rewrite_commit(uri, 4, lambda actions: actions.insert(1, disable))
    for version in range(3, 4 if disable_at_4 else 6):
        ict = stamp(ICT_MS[version])
        rewrite_commit(uri, version, lambda actions, ict=ict: ict(actions[0]["commitInfo"]))
    for version, ms in ICT_FILE_MS.items():
        os.utime(log / f"{version:020d}.json", ns=(ms * 1_000_000, ms * 1_000_000))


WRITERS: dict[str, Callable[[str], None]] = {
    "ict_enabled": functools.partial(write_ict, disable_at_4=False),
    "ict_toggled": functools.partial(write_ict, disable_at_4=True),
    "history": write_history,
    "toggled": write_toggled,
    "additive": write_additive,
    "upgraded": upgraded_without_cdf_feature,
    "same_mtime": write_same_mtime,
}


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("agree-tables")
    out = {}
    for name, write in WRITERS.items():
        uri = str(root / name)
        write(uri)
        out[name] = uri
    return out


def table_uri(case: Case, tables: Mapping[str, str]) -> str:
    return tables.get(case.table, case.table)


def last_version(uri: str, end: int | None) -> int:
    return end if end is not None else ds.read_snapshot(uri).version


# --- outcomes and how they are compared -----------------------------------------------------

Row = tuple[tuple[str, Any], ...]


def render(value: Any) -> Any:
    """A value as plain, comparable Python: timestamps as UTC ISO strings to the microsecond
    (``ntz:`` for ones without a zone), decimals as strings, floats by ``repr``."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            return "ntz:" + value.isoformat(timespec="microseconds")
        return value.astimezone(dt.UTC).isoformat(timespec="microseconds")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return f"decimal:{value}"
    if isinstance(value, float):
        return "float:nan" if math.isnan(value) else f"float:{value!r}"
    if isinstance(value, bytes):
        return "bytes:" + value.hex()
    if isinstance(value, Mapping):
        return tuple((k, render(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return tuple(render(v) for v in value)
    raise TypeError(f"cannot render {type(value).__name__}: {value!r}")


@dataclass
class Outcome:
    """What one consumer gave for a case: rows (columns, and rows rendered over them with
    absent columns as null), or an error (its class name and message)."""

    columns: frozenset[str] = frozenset()
    rows: Counter[Row] = field(default_factory=Counter)
    error: str | None = None
    message: str = ""

    @classmethod
    def of_rows(cls, rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> Outcome:
        names = set(columns)
        for r in rows:
            names.update(r)
        order = sorted(names)
        rendered = Counter(tuple((c, render(r.get(c))) for c in order) for r in rows)
        return cls(frozenset(names), rendered)

    @classmethod
    def of_table(cls, table: pa.Table, last: int) -> Outcome:
        table = table.filter(pc.less_equal(table["_commit_version"], last))
        return cls.of_rows(table.to_pylist(), table.column_names)

    @classmethod
    def of_error(cls, error: BaseException) -> Outcome:
        return cls(error=type(error).__name__, message=str(error))

    @property
    def refused_versions(self) -> tuple[int, ...] | None:
        found = re.search(r"version\(s\) ([0-9, -]+):", self.message)
        if found is None:
            return None
        versions: list[int] = []
        for part in found.group(1).split(", "):
            first, _, last = part.partition("-")
            versions += range(int(first), int(last or first) + 1)
        return tuple(versions)

    def describe(self) -> str:
        if self.error is not None:
            return f"{self.error}: {self.message[:300]}"
        return f"{sum(self.rows.values())} rows, columns {sorted(self.columns)}"


DELTASTREAM_ERRORS = {
    name
    for name, value in vars(ds_errors).items()
    if isinstance(value, type) and issubclass(value, ds_errors.DeltaStreamError)
}


def spark_error(error: BaseException) -> Outcome:
    """The deltastream error a Spark exception carries (Spark wraps the Python traceback of
    the data source in its own exception: the class name is read from the text)."""
    text = str(error)
    # The traceback's last line names the exception raised: "<module>.<Class>: <message>".
    raised = [
        (name, message)
        for name, message in re.findall(r"\b(\w+Error): ([^\n]*)", text)
        if name in DELTASTREAM_ERRORS
    ]
    if raised:
        name, message = raised[-1]
        return Outcome(error=name, message=message)
    return Outcome(error=f"{type(error).__name__} (no deltastream error)", message=text[:2000])


def row_diff(expected: Counter[Row], got: Counter[Row], limit: int = 6) -> str:
    missing, extra = expected - got, got - expected
    lines = [f"  missing {dict(r)} x{n}" for r, n in itertools.islice(missing.items(), limit)]
    lines += [f"  extra   {dict(r)} x{n}" for r, n in itertools.islice(extra.items(), limit)]
    return f"{sum(missing.values())} missing, {sum(extra.values())} extra\n" + "\n".join(lines)


def disagreements(outcomes: Mapping[str, Outcome]) -> list[str]:
    """How each consumer differs from read_changes (empty: they agree)."""
    reference = outcomes["read_changes"]
    found = []
    for consumer, outcome in outcomes.items():
        if consumer == "read_changes":
            continue
        if outcome.error != reference.error:
            found.append(
                f"{consumer}: {outcome.describe()}\n  read_changes: {reference.describe()}"
            )
        elif outcome.error is not None:
            if outcome.refused_versions != reference.refused_versions:
                found.append(
                    f"{consumer} refused versions {outcome.refused_versions}, read_changes "
                    f"{reference.refused_versions}"
                )
        elif outcome.columns != reference.columns:
            found.append(
                f"{consumer} columns {sorted(outcome.columns)}, read_changes "
                f"{sorted(reference.columns)}"
            )
        elif outcome.rows != reference.rows:
            found.append(f"{consumer} rows differ: {row_diff(reference.rows, outcome.rows)}")
    return found


# --- the consumers --------------------------------------------------------------------------


def changes_outcome(uri: str, case: Case) -> Outcome:
    try:
        reader = ds.read_changes(
            uri, start_version=case.start, end_version=case.end, infer_without_cdf=case.infer
        )
        table = reader.read_all()
    except ds.DeltaStreamError as e:
        return Outcome.of_error(e)
    return Outcome.of_rows(table.to_pylist(), table.column_names)


async def _tail(config: TailConfig, last: int, within: float) -> tuple[Collector, Tailer, Any]:
    collector = Collector()
    tailer = Tailer(config, collector.sink())
    failure: BaseException | None = None

    async def stop_past_the_end() -> None:
        await eventually(lambda: tailer.position is not None and tailer.position.version > last)
        tailer.stop()

    try:
        with anyio.fail_after(within):
            async with anyio.create_task_group() as tg:
                tg.start_soon(stop_past_the_end)
                await tailer.run()
                tg.cancel_scope.cancel()
    except* ds.DeltaStreamError as group:
        failure = group.exceptions[0]
    return collector, tailer, failure


def tailer_outcome(uri: str, case: Case, state: Path) -> Outcome:
    last = last_version(uri, case.end)
    config = fast(
        TailConfig(
            name="agree",
            uri=uri,
            state=str(state),
            mode=Mode.FOLLOW,
            start=StartFrom(version=case.start),
            notifications=False,
            infer_without_cdf=case.infer,
        )
    )
    collector, tailer, failure = anyio.run(_tail, config, last, 60.0)
    delivered_all = tailer.position is not None and tailer.position.version > last
    if failure is not None and not delivered_all:
        return Outcome.of_error(failure)
    rows = [r for r in collector.rows if r["_commit_version"] <= last]
    columns = {n for d in collector.deliveries for n in d.schema.names}
    return Outcome.of_rows(rows, sorted(columns))


@dataclass
class SparkOutcomes:
    batch: dict[str, Outcome]
    #: By (table uri, start version, infer): the stream's rows (unfiltered) or its error.
    streams: dict[tuple[str, int, bool], pa.Table | Outcome]

    def stream(self, uri: str, case: Case) -> Outcome:
        got = self.streams[(uri, case.start, case.infer)]
        if isinstance(got, Outcome):
            return got
        return Outcome.of_table(got, last_version(uri, case.end))


def spark_batch(spark: Any, uri: str, case: Case) -> Outcome:
    reader = (
        spark.read.format("deltastream")
        .option("readChangeFeed", "true")
        .option("startingVersion", case.start)
        .option("inferWithoutCdf", case.infer)
    )
    if case.end is not None:
        reader = reader.option("endingVersion", case.end)
    try:
        table = reader.load(uri).toArrow()
    except Exception as e:  # Spark's exceptions carry the data source's error as text
        return spark_error(e)
    return Outcome.of_rows(table.to_pylist(), table.column_names)  # no filter: it has an end


def spark_streams(
    spark: Any, starts: Sequence[tuple[str, int, bool]], checkpoints: Path, at_once: int = 1
) -> dict[tuple[str, int, bool], pa.Table | Outcome]:
    """One AvailableNow change-feed stream per (table, start, infer), ``at_once`` at a time,
    into memory sinks."""
    out: dict[tuple[str, int, bool], pa.Table | Outcome] = {}
    names = (f"agree_{i}" for i in itertools.count())
    for i in range(0, len(starts), at_once):
        running = []
        for uri, start, infer in starts[i : i + at_once]:
            name = next(names)
            try:
                query = (
                    spark.readStream.format("deltastream")
                    .option("readChangeFeed", "true")
                    .option("startingVersion", start)
                    .option("inferWithoutCdf", infer)
                    .load(uri)
                    .writeStream.format("memory")
                    .queryName(name)
                    .option("checkpointLocation", str(checkpoints / name))
                    .trigger(availableNow=True)
                    .start()
                )
            except Exception as e:
                out[(uri, start, infer)] = spark_error(e)
                continue
            running.append(((uri, start, infer), name, query))
        for key, name, query in running:
            try:
                finished = query.awaitTermination(300)
            except Exception as e:  # a failed query raises here, as well as in exception()
                out[key] = spark_error(e)
                continue
            if not finished:
                query.stop()
                out[key] = Outcome(error="timeout", message="the stream ran for 300 s")
            elif query.exception() is not None:
                out[key] = spark_error(query.exception())
            else:
                out[key] = spark.table(name).toArrow()
            spark.catalog.dropTempView(name)
    return out


@pytest.fixture(scope="module")
def spark_outcomes(
    spark: Any, tables: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> SparkOutcomes:
    batch = {}
    starts: list[tuple[str, int, bool]] = []
    for case in ALL_CASES:
        uri = table_uri(case, tables)
        batch[case.id] = spark_batch(spark, uri, case)
        if (uri, case.start, case.infer) not in starts:
            starts.append((uri, case.start, case.infer))
    streams = spark_streams(spark, starts, tmp_path_factory.mktemp("agree-checkpoints"))
    return SparkOutcomes(batch, streams)


# --- the tests ------------------------------------------------------------------------------


def outcomes_of(
    case: Case, tables: Mapping[str, str], spark: SparkOutcomes, state: Path
) -> Iterator[tuple[str, Outcome]]:
    uri = table_uri(case, tables)
    yield "read_changes", changes_outcome(uri, case)
    yield "tailer", tailer_outcome(uri, case, state)
    yield "spark batch", spark.batch[case.id]
    yield "spark stream", spark.stream(uri, case)


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.id)
def test_consumers_agree(
    case: Case, tables: dict[str, str], spark_outcomes: SparkOutcomes, tmp_path: Path
) -> None:
    outcomes = dict(outcomes_of(case, tables, spark_outcomes, tmp_path / "state"))
    found = disagreements(outcomes)
    assert not found, f"{case.id}: the consumers disagree:\n" + "\n".join(found)
    reference = outcomes["read_changes"]
    if case.refused is not None:
        assert reference.error == "ChangeDataNotEnabledError", reference.describe()
        assert reference.refused_versions == case.refused
    else:
        assert reference.error is None, reference.describe()
        assert reference.rows, "a case with no rows compares nothing"
        assert {"_change_type", "_commit_version", "_commit_timestamp"} <= reference.columns


def test_equal_file_times_give_strictly_increasing_commit_timestamps(
    tables: dict[str, str],
) -> None:
    """The rule all three apply (the same-mtime cases above) without in-commit timestamps:
    the commit file's modification time, made strictly increasing as time travel makes it
    (a file no newer than its predecessor's counts as 1 ms after it). So the timestamp that
    selects a version, by time travel or as the start of a range, is its rows'
    ``_commit_timestamp``, and the snapshot of that version carries it too."""
    uri = tables["same_mtime"]
    rows = ds.read_changes(uri, start_version=0).read_all().to_pylist()
    by_version = {r["_commit_version"]: r["_commit_timestamp"] for r in rows}
    ms = {v: round(s * 1000) for v, s in SAME_MTIMES.items()}
    increasing = {0: ms[0], 1: ms[1], 2: ms[1] + 1, 3: ms[1] + 2, 4: ms[4]}
    expected = {v: dt.datetime.fromtimestamp(t / 1000, dt.UTC) for v, t in increasing.items()}
    assert by_version == expected
    for version, when in expected.items():
        assert ds.read_snapshot(uri, timestamp=when).version == version
        assert ds.read_snapshot(uri, version=version).timestamp_ms == increasing[version]
        selected = ds.read_changes(uri, start_timestamp=when).read_all()
        assert min(selected.column("_commit_version").to_pylist()) == version
        first = selected.filter(pc.equal(selected.column("_commit_version"), version))
        assert set(first.column("_commit_timestamp").to_pylist()) == {when}


@pytest.mark.parametrize("name", ["ict_enabled", "ict_toggled"])
def test_in_commit_timestamps_where_enabled(name: str, tables: dict[str, str]) -> None:
    """The edited ICT tables say what they should: in-commit timestamps for versions 2 and
    3 (enabled from version 2), file times for the others."""
    rows = ds.read_changes(tables[name], start_version=0).read_all().to_pylist()
    by_version = {r["_commit_version"]: r["_commit_timestamp"] for r in rows}
    last_ict = 3 if name == "ict_toggled" else 5
    expected = {v: ICT_MS[v] if 2 <= v <= last_ict else ms for v, ms in ICT_FILE_MS.items()}
    assert {v: int(ts.timestamp() * 1000) for v, ts in by_version.items()} == expected
