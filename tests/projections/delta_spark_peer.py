"""A second Spark driver, with delta-spark, that the delta-spark tests drive from their own
process (which has lakefold's usual session, without delta-spark): one JSON command a line on
standard input, one answer a line (prefixed ``ANSWER``) on standard output.

Commands: ``read`` (a table, optionally ``version``, through ``spark.read.format("delta")``,
written to ``out`` as Parquet), ``lakefold_read`` (the same through lakefold's ``read_delta`` on
this delta-spark session), ``sql`` (statements; the rows of the last one), ``quit``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from lakefold._from_settings import session_from_settings
from lakefold.settings import load_settings
from lakefold.spark import read_delta


def answer(value: dict[str, Any]) -> None:
    sys.stdout.write("ANSWER " + json.dumps(value, default=str) + "\n")
    sys.stdout.flush()


def main() -> None:
    # The way a user turns delta-spark on: the settings (LAKEFOLD_DELTA_SPARK=true).
    settings = load_settings(
        delta_spark=True, spark_master="local[2]", home=Path(sys.argv[1]),
        delta_spark_jars=Path(os.environ["DELTA_SPARK_JARS"])
        if os.environ.get("DELTA_SPARK_JARS") else None,
        spark_conf={"spark.sql.shuffle.partitions": "2",
                    # The tests vacuum with a retention of seconds while lakefold writes.
                    "spark.databricks.delta.retentionDurationCheck.enabled": "false"})
    spark = session_from_settings(settings, app_name="lakefold-delta-spark-peer")
    spark.range(1).collect()  # the first action's cost is not a test's
    answer({"ready": True})
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        try:
            if op == "quit":
                answer({"bye": True})
                break
            if op in ("read", "lakefold_read"):
                if op == "read":
                    reader = spark.read.format("delta")
                    if command.get("version") is not None:
                        reader = reader.option("versionAsOf", command["version"])
                    frame = reader.load(command["path"])
                else:
                    frame = read_delta(spark, command["path"], version=command.get("version"))
                table = frame.toArrow()
                pq.write_table(table, command["out"])
                answer({"rows": table.num_rows})
            elif op == "sql":
                rows: list[Any] = []
                for statement in command["statements"]:
                    rows = spark.sql(statement).collect()
                answer({"rows": [row.asDict(recursive=True) for row in rows]})
            else:
                answer({"error": f"unknown op {op}"})
        except Exception as e:
            answer({"error": f"{type(e).__name__}: {e}",
                    "trace": traceback.format_exc(limit=3)})
    spark.stop()


if __name__ == "__main__":
    main()
