"""The victim of the SIGKILL loops: runs the projections of a test module until killed (or,
with ``finish``, until it has processed everything in the store).

``python -m tests.projections.kill_child MODULE DSN REDIS_URL HOME run|finish [NAME ...]``:
MODULE is a file name in this folder; NAMEs restrict the run to those projections."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from lakefold.projections import Runner, RunnerConfig, load_projections
from lakefold.projections.operations import SinkRoots
from lakefold.projections.runtime._runner import RUNNER_SPARK_CONF
from lakefold.settings import load_settings
from lakefold.spark import spark_session


def main() -> None:
    module, dsn, redis_url, home, mode, *only = sys.argv[1:]
    # With LAKEFOLD_S3_* in the environment the lake and the Spark checkpoints are in that
    # bucket (the settings register its object store for this process); else under HOME.
    settings = load_settings() if os.environ.get("LAKEFOLD_S3_BUCKET") else None
    spark = spark_session("local[2]", conf={
        **RUNNER_SPARK_CONF, "spark.sql.shuffle.partitions": "2",
        # a short-lived JVM: the C1 compiler alone starts about a third faster
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xss4m"},
        object_store=settings.object_store() if settings else None,
        hadoop_aws_jars=settings.hadoop_aws_jars if settings else None)
    registry = load_projections(str(Path(__file__).with_name(module)))
    lake = settings.lake_location if settings else None
    config = RunnerConfig(store_dsn=dsn, roots=SinkRoots.under(Path(home), lake),
                          redis_url=redis_url,
                          poll_seconds=0.1, only=tuple(only))
    with Runner(spark, registry, config) as runner:
        print("started", flush=True)
        runner.run(until_caught_up=mode == "finish", timeout=600 if mode == "finish" else None)
        print("caught up", flush=True)


if __name__ == "__main__":
    main()
