"""The driver program of ``spark_streams.killed_in_first_batches``, run as a script of its own
(the killed process must be a driver, and a process has one SparkContext):
``python spark_replay_driver.py TABLE ROOT FAILURE STREAMS``.

It starts the ``ReplayCase`` queries of TABLE of the stream kinds STREAMS (comma-separated;
checkpoints and outputs under ROOT) in a ``local[2]`` session; each one's first micro-batch,
its offsets logged, leaves its marker and fails by FAILURE (``ReplayCase.failing_writer``):
blocks until the process tree is killed, or raises (the query stops, the driver goes on).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from local_spark import local_session
from spark_streams import ReplayCase, start_replay_query, started


def main(uri: str, root: str, failure: str, streams: str) -> None:
    spark = local_session("deltastream-replay-driver")
    for case in ReplayCase.all(uri, Path(root), streams.split(",")):
        sink = case.failing_writer(failure)
        started(start_replay_query(spark, uri, case, sink, {"processingTime": "1 second"}))
    while True:  # until the test kills the process
        time.sleep(60)


if __name__ == "__main__":
    main(*sys.argv[1:])
