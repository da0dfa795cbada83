"""A second Spark driver, with delta-spark, that the delta-spark tests drive from their own
process (which has lakefold's usual session, without delta-spark): one JSON command a line on
standard input, one answer a line (prefixed ``ANSWER``) on standard output.

Commands: ``read`` (a table, optionally ``version``, through ``spark.read.format("delta")``,
written to ``out`` as Parquet), ``lakefold_read`` (the same through lakefold's ``read_delta`` on
this delta-spark session), ``changes`` (a table's change data feed from ``start``, through
``readChangeFeed``, written to ``out``), ``write`` (the rows of a ``query`` written to a table
with ``mode`` and writer ``options``, e.g. ``overwriteSchema``), ``sql`` (statements; the rows
of the last one),
``maintain`` (OPTIMIZE and VACUUM RETAIN ``retain_hours`` HOURS on ``paths`` in a loop until
the file ``stop`` exists; whole hours, as delta-spark rounds them), ``quit``.
"""

from __future__ import annotations

import json
import os
import sys
import time
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


def maintain(spark: Any, paths: list[str], stop: Path, retain_hours: int) -> dict[str, Any]:
    """OPTIMIZE then VACUUM (``retain_hours``) on each of ``paths`` until ``stop`` exists; a step
    that a concurrent commit made fail is kept, as delta-spark says it, and the loop goes on.
    The tallies so far, per path, are rewritten to ``<stop>.progress`` after each step."""
    done: dict[str, Any] = {"optimize": 0, "vacuum": 0, "files_removed": 0, "conflicts": [],
                            "tables": {p: {"optimized": 0, "vacuumed": 0, "conflicts": 0}
                                       for p in paths}}
    progress = stop.with_name(stop.name + ".progress")
    while not stop.exists():
        for path, step in [(p, s) for p in paths for s in ("optimize", "vacuum")]:
            table = "delta.`" + path.replace("`", "``") + "`"
            statement = f"OPTIMIZE {table}" if step == "optimize" \
                else f"VACUUM {table} RETAIN {int(retain_hours)} HOURS"
            tally = done["tables"][path]
            try:
                rows = spark.sql(statement).collect()  # a path the test owns
            except Exception as e:  # delta-spark's ConcurrentModification family
                lines = str(e).splitlines()
                cause = next((line for line in lines if "Exception" in line
                              or "DELTA_" in line), lines[0] if lines else repr(e))
                done["conflicts"].append(f"{step}: {cause.strip()[:300]}")
                tally["conflicts"] += 1
            else:
                done[step] += 1
                tally["optimized" if step == "optimize" else "vacuumed"] += 1
                if step == "optimize":
                    done["files_removed"] += int(rows[0]["metrics"]["numFilesRemoved"])
            scratch = progress.with_suffix(".tmp")
            scratch.write_text(json.dumps(done))
            scratch.replace(progress)
        time.sleep(0.02)
    return done


def main() -> None:
    # The way a user turns delta-spark on: the settings (LAKEFOLD_DELTA_SPARK=true).
    settings = load_settings(
        delta_spark=True, spark_master="local[2]", home=Path(sys.argv[1]),
        delta_spark_jars=Path(os.environ["DELTA_SPARK_JARS"])
        if os.environ.get("DELTA_SPARK_JARS") else None,
        spark_conf={"spark.sql.shuffle.partitions": "2",
                    # delta-spark's defaults for a cluster: 50 tasks to rebuild a snapshot's
                    # state, 10,000 to list a table's files for VACUUM. Two cores here.
                    "spark.databricks.delta.snapshotPartitions": "2",
                    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
                    # The tests vacuum with retentions below delta-spark's 7-day minimum.
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
            elif op == "changes":
                frame = (spark.read.format("delta").option("readChangeFeed", "true")
                         .option("startingVersion", command.get("start", 0))
                         .load(command["path"]))
                table = frame.toArrow()
                pq.write_table(table, command["out"])
                answer({"rows": table.num_rows})
            elif op == "write":
                writer = spark.sql(command["query"]).write.format("delta") \
                    .mode(command.get("mode", "append"))
                for key, value in (command.get("options") or {}).items():
                    writer = writer.option(key, value)
                writer.save(command["path"])
                answer({"written": True})
            elif op == "sql":
                rows: list[Any] = []
                for statement in command["statements"]:
                    rows = spark.sql(statement).collect()
                answer({"rows": [row.asDict(recursive=True) for row in rows]})
            elif op == "maintain":
                answer(maintain(spark, command["paths"], Path(command["stop"]),
                                command["retain_hours"]))
            else:
                answer({"error": f"unknown op {op}"})
        except Exception as e:
            answer({"error": f"{type(e).__name__}: {e}",
                    "trace": traceback.format_exc(limit=3)})
    spark.stop()


if __name__ == "__main__":
    main()
