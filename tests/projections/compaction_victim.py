"""The victim of the compaction SIGKILL loop: runs the compaction test projections
(``customer_cache``, ``price_history``) until killed, or with ``finish`` until caught up."""

from __future__ import annotations

import sys
from pathlib import Path

from lakefold.projections import Runner, RunnerConfig, SinkRoots, load_projections
from lakefold.projections._runner import RUNNER_SPARK_CONF
from lakefold.spark import spark_session


def main() -> None:
    dsn, redis_url, home, mode = sys.argv[1:5]
    spark = spark_session("local[2]", conf={
        **RUNNER_SPARK_CONF, "spark.sql.shuffle.partitions": "2",
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xss4m"})
    registry = load_projections(str(Path(__file__).with_name("compaction_projections.py")))
    config = RunnerConfig(store_dsn=dsn, roots=SinkRoots.under(Path(home)), redis_url=redis_url,
                          poll_seconds=0.1, only=("customer_cache", "price_history"))
    with Runner(spark, registry, config) as runner:
        print("started", flush=True)
        runner.run(until_caught_up=mode == "finish", timeout=600 if mode == "finish" else None)
        print("caught up", flush=True)


if __name__ == "__main__":
    main()
