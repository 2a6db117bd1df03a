"""The Spark examples of the documentation (docs/examples/spark/), run as a reader would in a
pyspark shell: with the session as ``spark``, in a directory holding the examples' table
(``events``) and the demo's (``deltastream-demo/table``). See tests/docs_examples.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docs_examples as dx
import pytest

from deltastream.demo import claim_demo_directory, create_demo_table


@pytest.mark.parametrize("example", dx.example_files(dx.SPARK), ids=lambda p: p.name)
def test_spark_example_runs(spark: Any, example: Path, tmp_path: Path) -> None:
    env = dx.prepare(tmp_path, dx.SPARK)
    create_demo_table(claim_demo_directory(tmp_path / "deltastream-demo"))
    dx.run_example(example, tmp_path, env, init_globals={"spark": spark})
