"""The Flink peer's job: run by the Flink virtualenv's Python (PyFlink pins its own pyarrow and
py4j, so it cannot share lakefold's environment), never imported by lakefold.

    python flink_job.py SPEC.json

SPEC: ``{"events": folder of the events' Parquet files, "jars": [jar paths], "parallelism": 2,
"out": folder, "lateness_s": 4, "timeout_s": per job, "rest_port": the mini-clusters' REST
port, "queries": [{"name", "sql", "collect"}]}``. For each query, in a local mini-cluster
(one per job, started with it):

1. throughput: ``INSERT INTO`` a ``blackhole`` table, timed from submission to the job's end
   (the filesystem source is bounded: the job ends when every file is read);
2. with ``collect``: the query again into a filesystem sink as Debezium JSON (an insert's
   ``after`` adds a row, a retraction's ``before`` takes one back), the final rows (times as
   milliseconds since the epoch) written to ``out/<name>.json``. Checkpoints every 2 s into
   ``out/checkpoints`` (the streaming file sink commits its files at checkpoints, the last
   at the end of the bounded input). The query's ``state_bytes``: the largest checkpoint's
   state size (a full snapshot of the hash-map state backend: the state held then), read
   from the job's mini-cluster's REST API while it runs (``/jobs/<id>/checkpoints``,
   ``state_size.max``). The mini-cluster goes with its job, and a finished job deletes its
   checkpoints, so what is read is a floor: a job of a few seconds completes one early
   checkpoint or none before it ends (null), never one at its end.

Prints one JSON object: name → ``{"seconds"}`` or ``{"error"}``, and ``rows`` and
``state_bytes`` when collected (``result_error`` when the results' run failed).
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from collections import Counter
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

_SOURCE = """CREATE TABLE events (
  `position` BIGINT, event_type TINYINT, `dateTime` TIMESTAMP_LTZ(3),
  p_id BIGINT, p_name STRING, p_emailAddress STRING, p_creditCard STRING, p_city STRING,
  p_state STRING, p_extra STRING,
  a_id BIGINT, a_itemName STRING, a_description STRING, a_initialBid BIGINT, a_reserve BIGINT,
  a_expires TIMESTAMP_LTZ(3), a_seller BIGINT, a_category BIGINT, a_extra STRING,
  b_auction BIGINT, b_bidder BIGINT, b_price BIGINT, b_channel STRING, b_url STRING,
  b_extra STRING,
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '{lateness}' SECOND
) WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'parquet')"""
_VIEWS = [
    """CREATE VIEW person AS SELECT `position`, p_id AS id, p_name AS name,
         p_emailAddress AS emailAddress, p_creditCard AS creditCard, p_city AS city,
         p_state AS state, `dateTime`, p_extra AS extra FROM events WHERE event_type = 0""",
    """CREATE VIEW auction AS SELECT `position`, a_id AS id, a_itemName AS itemName,
         a_description AS description, a_initialBid AS initialBid, a_reserve AS reserve,
         `dateTime`, a_expires AS expires, a_seller AS seller, a_category AS category,
         a_extra AS extra FROM events WHERE event_type = 1""",
    """CREATE VIEW bid AS SELECT `position`, b_auction AS auction, b_bidder AS bidder,
         b_price AS price, b_channel AS channel, b_url AS url, `dateTime`, b_extra AS extra
         FROM events WHERE event_type = 2""",
]


def _environment(spec: dict[str, Any]) -> Any:
    from pyflink.table import EnvironmentSettings, TableEnvironment

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = env.get_config()
    config.set("pipeline.jars", ";".join(Path(j).resolve().as_uri() for j in spec["jars"]))
    config.set("parallelism.default", str(spec["parallelism"]))
    config.set("table.local-time-zone", "UTC")
    # the REST API of the job's mini-cluster (one per job, gone with it), where the job's
    # checkpoint statistics are read while it runs
    config.set("rest.bind-port", str(spec["rest_port"]))
    config.set("execution.checkpointing.dir",
               (Path(spec["out"]) / "checkpoints").resolve().as_uri())
    # One scan of the files feeding both inputs of a join (Flink's source reuse, on by
    # default) left q7, q19 and q20 hanging at 100k events (idle, never ending); each view of
    # the events reads the files itself instead.
    config.set("table.optimizer.reuse-source-enabled", "false")
    env.execute_sql(_SOURCE.format(lateness=int(spec["lateness_s"]),
                                   path=str(spec["events"]).replace("'", "''")))
    for statement in _VIEWS:
        env.execute_sql(statement)
    return env


class QueryTimeout(Exception):
    """A job did not end within the spec's ``timeout_s`` (it was cancelled)."""


def _run(result: Any, timeout_s: float) -> None:
    """Wait for a submitted job's end; cancel it after ``timeout_s`` (a stuck job would hold
    the mini-cluster's slots and stall every later query)."""
    try:
        result.wait(round(timeout_s * 1000))
    except Exception as e:
        client = result.get_job_client()
        if client is not None:
            client.cancel().result()
        raise QueryTimeout(f"did not end within {timeout_s:.0f} s; cancelled") from e


def _throughput(env: Any, name: str, sql: str, timeout_s: float) -> float:
    from pyflink.table import Schema, TableDescriptor

    table = env.sql_query(sql)
    schema = Schema.new_builder().from_row_data_type(
        table.get_schema().to_row_data_type()).build()
    sink = f"blackhole_{name}"
    env.create_temporary_table(sink, TableDescriptor.for_connector("blackhole").schema(
        schema).build())
    began = time.perf_counter()
    _run(table.execute_insert(sink), timeout_s)
    return time.perf_counter() - began


def _millis(text: str) -> int:
    moment = datetime.fromisoformat(text.replace(" ", "T").rstrip("Z")).replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


def _value(value: Any, is_time: bool) -> Any:
    if value is None:
        return None
    if is_time:
        return _millis(str(value))
    return float(value) if isinstance(value, Decimal) else value


class StateWatch(threading.Thread):
    """Reads a running job's checkpoint statistics every 50 ms (its mini-cluster, and
    with it the REST API, ends with the job); ``largest``: the largest completed checkpoint's
    state size seen (None: none completed while it was read)."""

    def __init__(self, port: int, job: str) -> None:
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/jobs/{job}/checkpoints"
        self.largest: int | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.05):
            try:
                with urllib.request.urlopen(self.url, timeout=5) as answer:  # noqa: S310
                    stats = json.load(answer)
            except (OSError, ValueError):  # not up yet, or gone with the job
                continue
            if stats.get("counts", {}).get("completed"):
                size = int(stats["summary"]["state_size"]["max"])
                self.largest = max(size, self.largest or 0)


def _collect(env: Any, name: str, sql: str, out: Path, timeout_s: float,
             rest_port: int) -> tuple[int, int | None]:
    """The query's final rows into ``out/<name>.json``: its changelog written by a filesystem
    sink as Debezium JSON (an insert has ``after``, a retraction ``before``), applied here.
    Collecting through PyFlink instead goes row by row through Py4J: minutes for 100k rows.
    Returns the rows' count and the job's largest checkpointed state (bytes)."""
    from pyflink.table import Schema, TableDescriptor

    table = env.sql_query(sql)
    fields = table.get_schema().get_field_names()
    types = [str(t).upper() for t in table.get_schema().get_field_data_types()]
    times = {f for f, t in zip(fields, types, strict=True) if "TIMESTAMP" in t}
    folder = out / f"{name}-changelog"
    schema = Schema.new_builder().from_row_data_type(
        table.get_schema().to_row_data_type()).build()
    sink = f"changelog_{name}"
    env.create_temporary_table(sink, TableDescriptor.for_connector("filesystem").schema(
        schema).option("path", str(folder)).option("format", "debezium-json").option(
        "debezium-json.timestamp-format.standard", "ISO-8601").build())
    env.get_config().set("execution.checkpointing.interval", "2 s")
    try:
        submitted = table.execute_insert(sink)
        watch = StateWatch(rest_port, str(submitted.get_job_client().get_job_id()))
        watch.start()
        try:
            _run(submitted, timeout_s)
        finally:
            watch.done.set()
            watch.join()
    finally:  # the throughput runs take no checkpoint (a bounded run of seconds)
        env.get_config().set("execution.checkpointing.interval", "30 min")
    rows: Counter[tuple[Any, ...]] = Counter()
    for part in sorted(folder.rglob("*")):
        if not part.is_file() or part.name.startswith(("_", ".")):  # committed files only
            continue
        for line in part.read_text().splitlines():
            if not line.strip():
                continue
            change = json.loads(line)
            if change.get("before") is not None:
                rows[tuple(_value(change["before"][f], f in times) for f in fields)] -= 1
            if change.get("after") is not None:
                rows[tuple(_value(change["after"][f], f in times) for f in fields)] += 1
    listed = []
    for values, count in rows.items():
        listed += [dict(zip(fields, values, strict=True))] * max(count, 0)
    (out / f"{name}.json").write_text(json.dumps({"columns": fields, "rows": listed}))
    return len(listed), watch.largest


def _reason(error: Exception) -> str:
    """The Java exception's line of a Py4J error (its first line says only which call)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    found = next((line for line in lines if "Exception:" in line and "Py4J" not in line),
                 lines[0] if lines else type(error).__name__)
    return found[:500]


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    env = _environment(spec)
    report: dict[str, Any] = {}
    for query in spec["queries"]:
        name, sql = query["name"], query["sql"]
        try:
            timeout = float(spec["timeout_s"])
            report[name] = {"seconds": round(_throughput(env, name, sql, timeout), 3)}
        except QueryTimeout as e:
            report[name] = {"error": f"{name}: {e}"}
        except Exception as e:  # reported per query, the others go on
            report[name] = {"error": _reason(e)}
        if query["collect"] and "seconds" in report[name]:
            try:
                report[name]["rows"], report[name]["state_bytes"] = _collect(
                    env, name, sql, out, timeout, int(spec["rest_port"]))
            except QueryTimeout as e:
                report[name]["result_error"] = f"the results' run: {e}"
            except Exception as e:
                report[name]["result_error"] = _reason(e)
    sys.stdout.write(json.dumps(report) + "\n")


if __name__ == "__main__":
    main()
