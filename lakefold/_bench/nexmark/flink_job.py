"""The Flink peer's job: run by the Flink virtualenv's Python (PyFlink pins its own pyarrow and
py4j, so it cannot share lakefold's environment), never imported by lakefold.

    python flink_job.py SPEC.json

SPEC: ``{"events": folder of the events' Parquet files, "jars": [jar paths], "parallelism": 2,
"out": folder, "lateness_s": 4, "queries": [{"name", "sql", "collect"}]}``. For each query, in
one local mini-cluster (started by the first job):

1. throughput: ``INSERT INTO`` a ``blackhole`` table, timed from submission to the job's end
   (the filesystem source is bounded: the job ends when every file is read);
2. with ``collect``: the query again, its changelog collected (+I/+U add a row, -U/-D take one
   back), times as milliseconds since the epoch, written to ``out/<name>.json``.

Prints one JSON object: name → ``{"seconds"}`` or ``{"error"}``, and ``rows`` when collected.
"""

from __future__ import annotations

import json
import sys
import time
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
    env.execute_sql(_SOURCE.format(lateness=int(spec["lateness_s"]),
                                   path=str(spec["events"]).replace("'", "''")))
    for statement in _VIEWS:
        env.execute_sql(statement)
    return env


def _throughput(env: Any, name: str, sql: str) -> float:
    from pyflink.table import Schema, TableDescriptor

    table = env.sql_query(sql)
    schema = Schema.new_builder().from_row_data_type(
        table.get_schema().to_row_data_type()).build()
    sink = f"blackhole_{name}"
    env.create_temporary_table(sink, TableDescriptor.for_connector("blackhole").schema(
        schema).build())
    began = time.perf_counter()
    table.execute_insert(sink).wait()
    return time.perf_counter() - began


def _millis(text: str) -> int:
    moment = datetime.fromisoformat(text.replace(" ", "T")).replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


def _collect(env: Any, name: str, sql: str, out: Path) -> int:
    """The query's final rows (its changelog applied) into ``out/<name>.json``."""
    from pyflink.common import RowKind

    table = env.sql_query(sql)
    env.create_temporary_view(f"result_{name}", table)
    fields = table.get_schema().get_field_names()
    types = [str(t) for t in table.get_schema().get_field_data_types()]
    times = [i for i, t in enumerate(types) if "TIMESTAMP" in t.upper()]
    select = ", ".join(f"CAST(`{f}` AS STRING) AS `{f}`" if i in times else f"`{f}`"
                       for i, f in enumerate(fields))
    rows: Counter[tuple[Any, ...]] = Counter()
    query = f"SELECT {select} FROM result_{name}"  # noqa: S608 - the query's own columns
    with env.sql_query(query).execute().collect() as results:
        for row in results:
            values = tuple(row[i] for i in range(len(fields)))
            kind = row.get_row_kind()
            if kind in (RowKind.INSERT, RowKind.UPDATE_AFTER):
                rows[values] += 1
            else:
                rows[values] -= 1
    listed = []
    for values, count in rows.items():
        if count <= 0:
            continue
        row = {f: _millis(v) if i in times and v is not None else
               float(v) if isinstance(v, Decimal) else v
               for i, (f, v) in enumerate(zip(fields, values, strict=True))}
        listed += [row] * count
    (out / f"{name}.json").write_text(json.dumps({"columns": fields, "rows": listed}))
    return len(listed)


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
            report[name] = {"seconds": round(_throughput(env, name, sql), 3)}
            if query["collect"]:
                report[name]["rows"] = _collect(env, name, sql, out)
        except Exception as e:  # reported per query, the others go on
            report[name] = {"error": _reason(e)}
    sys.stdout.write(json.dumps(report) + "\n")


if __name__ == "__main__":
    main()
