"""The command line: JSON on stdout, one-line errors on stderr with exit status 2."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import logbuilder as lb
import pyarrow.parquet as pq
import pytest
from conftest import CORPORA, S3Bucket

from deltastream.cli import run

DV_TABLE = CORPORA / "delta-kernel-rs/golden_data/dv-partitioned-with-checkpoint/delta"
ESCAPED = CORPORA / "delta-kernel-rs/golden_data/data-reader-escaped-chars/delta"


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = run(list(argv), out)
    return code, out.getvalue()


def test_snapshot_prints_summary() -> None:
    code, out = cli("snapshot", str(DV_TABLE))
    assert code == 0
    summary = json.loads(out)
    assert summary["version"] == 15
    assert summary["protocol"] == {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["deletionVectors"],
        "writerFeatures": ["deletionVectors"],
    }
    assert set(summary["metadata"]) == {"id", "schemaString", "partitionColumns", "configuration"}
    assert summary["metadata"]["partitionColumns"] == ["part"]
    assert summary["num_files"] > 0 and summary["size_bytes"] > 0


def test_snapshot_time_travel() -> None:
    code, out = cli("snapshot", str(DV_TABLE), "--version", "3")
    assert code == 0 and json.loads(out)["version"] == 3


def test_files_prints_each_live_file_as_in_the_log() -> None:
    code, out = cli("files", str(ESCAPED))
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    log_paths = set()
    for f in sorted((ESCAPED / "_delta_log").glob("*.json")):
        for line in f.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                log_paths.add(action["add"]["path"])
    assert {r["path"] for r in rows} <= log_paths
    assert all(
        set(r) == {"path", "size", "partitionValues", "modificationTime", "deletionVector"}
        for r in rows
    )
    assert any("%" in r["path"] for r in rows)  # percent-encoded exactly as written


def test_files_with_deletion_vectors() -> None:
    code, out = cli("files", str(DV_TABLE))
    rows = [json.loads(line) for line in out.splitlines()]
    dvs = [r["deletionVector"] for r in rows if r["deletionVector"]]
    assert code == 0 and dvs
    assert all(dv["storageType"] in ("u", "i", "p") and dv["cardinality"] > 0 for dv in dvs)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["snapshot", "/definitely/not/here"], "/definitely/not/here: not a Delta table: no such"),
        (["snapshot", "/definitely/../not/here"], "error: /not/here: not a Delta table"),
        (["snapshot", str(DV_TABLE), "--version", "99"], "cannot load version 99"),
        (["snapshot", str(DV_TABLE), "--timestamp", "soon"], "not an ISO-8601 timestamp"),
        (["snapshot", str(DV_TABLE), "--storage-option", "region"], "KEY=VALUE"),
        (
            ["snapshot", str(DV_TABLE), "--storage-option", "region=x"],
            "only apply to tables in object stores",
        ),
        (["snapshot", "hdfs://namenode/t"], "unsupported URI scheme"),
        (
            ["files", str(CORPORA / "delta-kernel-rs/golden_data/versions-not-contiguous/delta")],
            "missing commit",
        ),
    ],
)
def test_errors_are_one_line_with_status_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = cli(*argv)
    err = capsys.readouterr().err
    assert code == 2 and out == ""
    lines = [line for line in err.splitlines() if line.startswith("deltastream: error:")]
    assert len(lines) == 1 and message in lines[0]
    assert "Traceback" not in err


def test_corrupt_commit_error_names_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    w = lb.LogWriter(tmp_path)
    w.commit(0, lb.protocol(), lb.metadata())
    w.raw(f"{1:020d}.json", b'{"add": {"path": "a"\n')
    code, _ = cli("snapshot", str(tmp_path))
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert (
        err.startswith("deltastream: error: ")
        and "00000000000000000001.json: line 1: invalid JSON" in err
    )
    assert "\n" not in err


def test_s3_with_storage_options(s3_bucket: S3Bucket) -> None:
    uri = s3_bucket.upload_dir(DV_TABLE, "dv")
    options = [f"--storage-option={k}={v}" for k, v in s3_bucket.storage_options.items()]
    code, out = cli("snapshot", uri, *options)
    assert code == 0 and json.loads(out)["version"] == 15


def test_console_script_runs() -> None:
    exe = shutil.which("deltastream")
    assert exe is not None, "the deltastream console script is not installed (pip install -e .)"
    done = subprocess.run(
        [exe, "snapshot", str(DV_TABLE)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and json.loads(done.stdout)["version"] == 15
    done = subprocess.run(
        [sys.executable, "-m", "deltastream", "snapshot", "/not/here"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and done.stderr.startswith("deltastream: error:")


CDF_TABLE = CORPORA / "delta-kernel-rs/data/cdf-table"


def test_read_to_json_lines() -> None:
    code, out = cli(
        "read", str(CDF_TABLE), "--columns", "id,birthday", "--where", "id < 3", "-o", "-"
    )
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert sorted(r["id"] for r in rows) == [1, 2]
    assert all(set(r) == {"id", "birthday"} and len(r["birthday"]) == 10 for r in rows)


def test_read_to_parquet(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    import deltastream as ds

    target = tmp_path / "out" / "rows.parquet"
    code, out = cli("read", str(DV_TABLE), "--version", "5", "-o", str(target))
    assert code == 0 and json.loads(out) == {
        "output": str(target),
        "rows": pq.read_metadata(target).num_rows,
    }
    assert pq.read_table(target).equals(ds.read_rows(str(DV_TABLE), version=5).read_all())


def test_changes_to_json_lines() -> None:
    code, out = cli("changes", str(CDF_TABLE), "--from", "1", "--to", "2", "-o", "-")
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and rows
    assert {r["_commit_version"] for r in rows} <= {1, 2}
    assert {r["_change_type"] for r in rows} >= {"update_preimage", "update_postimage"}
    assert all(r["_commit_timestamp"].endswith("+00:00") for r in rows)


def test_changes_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = cli("changes", str(CDF_TABLE), "--from", "99", "-o", "-")
    assert code == 2 and "start version 99 is after the latest version 3" in capsys.readouterr().err
    code, _ = cli("changes", str(CDF_TABLE), "-o", str(tmp_path / "out.csv"))
    assert code == 2 and "must be a .parquet file or -" in capsys.readouterr().err
    code, out = cli("changes", str(CDF_TABLE), "--from", "99", "--allow-empty-range", "-o", "-")
    assert code == 0 and out == ""


def test_failed_read_leaves_no_output_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    table = tmp_path / "t"
    shutil.copytree(CDF_TABLE, table)
    victim = sorted(table.glob("birthday=*/*.parquet"))[-1]
    victim.unlink()
    target = tmp_path / "rows.parquet"
    code, _ = cli("read", str(table), "-o", str(target))
    err = capsys.readouterr().err
    assert code == 2 and "file not found" in err and victim.name in err
    assert not target.exists() and not list(tmp_path.glob(".deltastream-*"))


def test_programs_use_jemalloc_unless_told_otherwise() -> None:
    code = "from deltastream.runtime import use_fast_allocator; print(use_fast_allocator())"
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.strip() == "jemalloc"
    env["ARROW_DEFAULT_MEMORY_POOL"] = "system"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.strip() == "system"


CDF_SIMPLE = CORPORA / "delta-kernel-rs/data/cdf-table-simple"


def test_the_command_never_imports_pandas(tmp_path: Path) -> None:
    """pyarrow would import pandas (~0.4 s, ~35 MiB) at the command's first conversion of
    the log's values, only to learn that none is a pandas object."""
    command = ["-X", "importtime", "-m", "deltastream", "changes", str(CDF_SIMPLE)]
    done = subprocess.run(
        [sys.executable, *command, "-o", str(tmp_path / "rows.parquet")],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert "deltastream.changes.api" in imported  # it did read the changes
    assert pq.read_metadata(tmp_path / "rows.parquet").num_rows > 0
    # (-X importtime lists pyarrow's refused attempts too, as a bare "pandas" of no time:
    # pandas itself loads dozens of its modules)
    assert not {m for m in imported if m.startswith("pandas.")}


KEEP_PANDAS_OUT = """
import sys
import pyarrow as pa
from deltastream.runtime import keep_pandas_out_of_pyarrow

keep_pandas_out_of_pyarrow()
keep_pandas_out_of_pyarrow()
ints, texts = pa.array([1, None], pa.int64()), pa.array(["a", None], pa.string())
assert ints.null_count == texts.null_count == 1 and pa.scalar(2.5, pa.float64()).as_py() == 2.5
assert "pandas" not in sys.modules  # the answer "no pandas" was given, not looked up
keep_pandas_out_of_pyarrow(alone=True)  # and, asked later, type inference's too
assert pa.array([1, None]).type == pa.int64() and "pandas" not in sys.modules
import importlib.util

assert importlib.util.find_spec("pandas") is not None  # a look (libraries probe so) imports
assert "pandas" not in sys.modules  # nothing, and leaves pyarrow to be told at the import:
import pandas as pd  # imported all the same: pyarrow is told, and its pandas ways hold

assert pa.types.is_dictionary(pa.array(pd.Series(["a", "b", "a"], dtype="category")).type)
assert pa.array(pd.Series([1.0, float("nan")])).null_count == 1  # pandas' NaN is null
assert pa.table({"x": [1, None]}).to_pandas()["x"].isna().tolist() == [False, True]
print("ok")
"""


def test_pyarrow_kept_from_pandas_uses_pandas_exactly_once_imported() -> None:
    done = subprocess.run(
        [sys.executable, "-c", KEEP_PANDAS_OUT], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.metadata
    import tomllib

    import deltastream

    declared = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    version = declared["project"]["version"]  # the one place the version is written
    assert importlib.metadata.version("deltastream") == version == deltastream.__version__
    with pytest.raises(SystemExit) as exit_:
        run(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"deltastream {version}\n"


def test_a_directory_without_a_table_is_told_apart_from_a_missing_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("")
    expected = {
        "empty": "not a Delta table: no commits or checkpoints in _delta_log",
        "missing": "not a Delta table: no such directory",
        "file": "not a Delta table: a file, not a directory",
    }
    for name, problem in expected.items():
        code, _ = cli("snapshot", str(tmp_path / "sub" / ".." / name))
        assert code == 2
        # The path as given, with "sub/.." resolved.
        assert capsys.readouterr().err == f"deltastream: error: {tmp_path / name}: {problem}\n"


def test_paths_are_echoed_normalised() -> None:
    code, out = cli("snapshot", f"{DV_TABLE}/../delta/./")
    assert code == 0 and json.loads(out)["table"] == str(DV_TABLE)


def test_change_data_off_names_the_option_in_each_interface(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cdf_tables import upgraded_without_cdf_feature

    upgraded_without_cdf_feature(str(tmp_path))
    code, out = cli("changes", str(tmp_path), "--from", "2", "-o", "-")
    err = capsys.readouterr().err
    assert code == 2 and out == ""
    assert err.startswith(f"deltastream: error: {tmp_path}: change data is not available for")
    assert "pass --infer-without-cdf (infer_without_cdf=True in Python" in err
    assert "infer_without_cdf = true in the TOML" in err
    assert "the Spark option inferWithoutCdf" in err
    code, out = cli("changes", str(tmp_path), "--from", "2", "--infer-without-cdf", "-o", "-")
    assert code == 0 and {json.loads(line)["_commit_version"] for line in out.splitlines()} == {2}


BIG_OUTPUT = [
    ["files", str(DV_TABLE)],
    ["read", str(DV_TABLE), "-o", "-"],
    ["changes", str(CDF_TABLE), "-o", "-"],
]


@pytest.mark.parametrize("argv", BIG_OUTPUT, ids=lambda argv: argv[0])
def test_a_closed_stdout_ends_the_command_quietly(argv: list[str]) -> None:
    """``deltastream files T | head -1``: the reader goes away; no traceback, status 141
    (128 + SIGPIPE, what ``cat`` reports). The pipe is closed before the command writes, so
    that every run meets it (a small output could otherwise fit in the pipe's buffer)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "deltastream", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert stderr == ""


def test_a_closed_stdout_after_some_output_ends_quietly(tmp_path: Path) -> None:
    """The shell's ``| head -1`` itself, on an output far larger than a pipe's buffer: the
    first line arrives, then the reader exits while the command still writes."""
    import pyarrow as pa
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path), pa.table({"id": pa.array(range(200_000), pa.int64())}))
    done = subprocess.run(
        f"{sys.executable} -m deltastream read {tmp_path} -o - | head -1; "
        'echo "status=${PIPESTATUS[0]}" >&2',
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(done.stdout) == {"id": 0}
    assert done.stderr == "status=141\n"


def test_tail_into_a_closed_stdout_ends_quietly(tmp_path: Path) -> None:
    """``deltastream tail T --sink jsonl:- | head``: status 141 and no error logged (the
    reader going away is how such a run ends, not a failure)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    table = tmp_path / "t"
    write_deltalake(str(table), pa.table({"id": pa.array(range(200_000), pa.int64())}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "deltastream", "tail", str(table), "--sink", "jsonl:-",
         "--state", str(tmp_path / "s"), "--mode", "snapshot"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, stderr
    assert "ERROR" not in stderr and "error" not in stderr.lower(), stderr


def test_a_bare_word_in_where_is_no_column_and_strings_are_quoted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--where "name = NL"``: NL is named as no column, with the table's columns and how a
    string is written; the Python API says the same (one parser for every consumer)."""
    import deltastream as ds

    problem = (
        "invalid predicate at position 8 of 'name = NL': unknown column NL; the table has id, "
        "name, birthday{more}; string literals are quoted: 'NL'"
    )
    change_columns = ", _change_type, _commit_version, _commit_timestamp"
    code, out = cli("read", str(CDF_TABLE), "--where", "name = NL", "-o", "-")
    assert (code, out) == (2, "")
    assert capsys.readouterr().err == f"deltastream: error: {problem.format(more='')}\n"
    code, out = cli("changes", str(CDF_TABLE), "--where", "name = NL", "-o", "-")
    assert (code, out) == (2, "")
    assert capsys.readouterr().err == f"deltastream: error: {problem.format(more=change_columns)}\n"
    with pytest.raises(ds.InvalidArgumentError) as e:
        ds.read_rows(str(CDF_TABLE), where="name = NL")
    assert str(e.value) == problem.format(more="")
    with pytest.raises(ds.InvalidArgumentError) as e:
        ds.read_changes(str(CDF_TABLE), where="name = NL").read_all()
    assert str(e.value) == problem.format(more=change_columns)


STORAGE_OPTION_HELP = (
    "object store setting (S3: endpoint_url, region, access_key_id, …; GCS: "
    "google_service_account, …; Azure: azure_storage_account_name, …); may repeat"
)


@pytest.mark.parametrize("command", ["snapshot", "files", "read", "changes", "tail"])
def test_storage_option_help_names_every_store(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One help text for ``--storage-option`` in every command, listing every object store
    from where the stores are registered."""
    monkeypatch.setenv("COLUMNS", "400")  # one line per option
    with pytest.raises(SystemExit) as e:
        run([command, "--help"])
    assert e.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.lstrip().startswith("--storage-option")]
    assert lines[at : at + 2] == [
        "  --storage-option KEY=VALUE",
        " " * 24 + STORAGE_OPTION_HELP,  # argparse's column for help after a long option
    ]


def test_the_object_store_list_is_every_store() -> None:
    """:data:`OBJECT_STORES` is every kind of object store, each with options it accepts and
    URIs that are its own."""
    import importlib
    from typing import get_args

    from deltastream.storage import OBJECT_STORES, storage_option_names
    from deltastream.storage.paths import StoreKind, store_kind

    assert [s.kind for s in OBJECT_STORES] == [k for k in get_args(StoreKind) if k != "file"]
    for store in OBJECT_STORES:
        accepted = importlib.import_module(store.options_module).STORAGE_OPTION_NAMES
        assert set(store.examples) <= accepted <= storage_option_names()
        uris = [word.strip("(),") for word in store.uris.split() if "://" in word]
        assert uris and {store_kind(uri) for uri in uris} == {store.kind}


def parse(*argv: str) -> Any:
    from deltastream.cli import _build_parser

    return _build_parser().parse_args(list(argv))


TAIL = ("tail", "/t", "--sink", "jsonl:-", "--state", "/s")


def test_verbose_and_log_level_go_before_or_after_the_command() -> None:
    """``-v`` and ``--log-level`` mean the same before the command and after it; given
    after, they win, and not given after, they leave what was given before."""
    from deltastream.cli import _tail_config

    for argv in (["-v", "snapshot", "/t"], ["snapshot", "/t", "-v"], ["snapshot", "-v", "/t"]):
        assert parse(*argv).verbose is True, argv
    assert parse("snapshot", "/t").verbose is False
    for argv in (["--log-level", "debug", *TAIL], [*TAIL, "--log-level", "debug"]):
        assert _tail_config(parse(*argv)).log_level == "debug", argv
    assert _tail_config(parse(*TAIL)).log_level == "info"
    both = parse("--log-level", "error", *TAIL, "--log-level", "debug")
    assert _tail_config(both).log_level == "debug"
    assert parse("--log-level", "error", "read", "/t", "-o", "-").log_level == "error"
    assert parse("read", "/t", "-o", "-", "--log-level", "error").log_level == "error"


def test_serve_takes_log_level_before_or_after_the_command(tmp_path: Path) -> None:
    from deltastream.cli import _serve_config

    config = tmp_path / "deltastream.toml"
    config.write_text('[server]\nlog_level = "warning"\n\n[[tables]]\nname = "t"\nuri = "/t"\n'
                      f'sink = "jsonl:-"\nstate = "{tmp_path / "s"}"\n')  # fmt: skip
    serve = ("serve", "--config", str(config))
    assert _serve_config(parse(*serve)).log_level == "warning"
    assert _serve_config(parse("--log-level", "debug", *serve)).log_level == "debug"
    assert _serve_config(parse(*serve, "--log-level", "debug")).log_level == "debug"


def test_log_level_after_tail_quiets_or_opens_its_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same run, its level or -v given before or after ``tail``: the same log."""
    import pyarrow as pa
    from deltalake import write_deltalake

    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"id": pa.array(range(10), pa.int64())}))
    runs = iter(range(100))

    def tail(before: list[str], after: list[str]) -> str:
        state = str(tmp_path / f"state-{next(runs)}")
        args = ["tail", uri, "--sink", "jsonl:-", "--state", state, "--mode", "snapshot"]
        assert run([*before, *args, "--progress", "never", *after]) == 0
        return capsys.readouterr().err  # (the rows went to stdout)

    default = tail([], [])
    assert (
        "INFO deltastream.daemon.stream.tailer: t: delivering the snapshot of version 0" in default
    )
    assert tail(["--log-level", "warning"], []) == tail([], ["--log-level", "warning"]) == ""
    for verbose in (tail(["-v"], []), tail([], ["-v"])):
        assert "DEBUG deltastream.daemon" in verbose


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    """What the command line prints for a mistake argparse finds (exit status 2)."""
    with pytest.raises(SystemExit) as e:
        run(argv)
    assert e.value.code == 2
    return capsys.readouterr().err.splitlines()


def test_a_misspelt_option_suggests_the_right_one_with_the_commands_usage(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # usages on one line
    err = usage_error(["changes", str(CDF_TABLE), "--form", "3", "-o", "-"], capsys)
    assert err[0].startswith("usage: deltastream changes [-h] [--storage-option KEY=VALUE] ")
    assert err[1:] == [
        "deltastream changes: error: unrecognized arguments: --form 3; --form: did you mean --from?"
    ]
    assert usage_error(["reset", "--state", "/s", "--sink", "jsonl:-", "--nme", "t"], capsys) == [
        "usage: deltastream reset [-h] --state STATE --sink SINK --name NAME "
        "[--sink-option KEY=VALUE] [--force] [--state-storage-option KEY=VALUE] [-v] "
        "[--log-level {debug,info,warning,error}]",
        "deltastream reset: error: the following arguments are required: --name; --nme: did "
        "you mean --name?",
    ]
    assert usage_error([*TAIL, "--mode", "folow"], capsys)[-1] == (
        "deltastream tail: error: argument --mode: invalid choice: 'folow' (choose from "
        "'snapshot', 'follow', 'snapshot-and-follow'); 'folow': did you mean 'follow'?"
    )
    # Before the command, the top level's options and usage.
    assert usage_error(["--verbse", "snapshot", "/t"], capsys) == [
        "usage: deltastream [-h] [-v] [--log-level {debug,info,warning,error}] [--version] "
        "COMMAND ...",
        "deltastream: error: unrecognized arguments: --verbse; --verbse: did you mean --verbose?",
    ]
    # Nothing close: no suggestion.
    assert usage_error(["snapshot", "/t", "--xyzzy"], capsys)[-1] == (
        "deltastream snapshot: error: unrecognized arguments: --xyzzy"
    )


def test_a_misspelt_command_suggests_the_right_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    assert usage_error(["tial", "/t"], capsys) == [
        "usage: deltastream [-h] [-v] [--log-level {debug,info,warning,error}] [--version] "
        "COMMAND ...",
        "deltastream: error: argument COMMAND: invalid choice: 'tial' (choose from 'snapshot', "
        "'files', 'read', 'changes', 'tail', 'reset', 'serve', 'demo'); 'tial': did you mean "
        "'tail'?",
    ]
