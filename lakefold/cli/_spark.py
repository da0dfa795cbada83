"""``lakefold query``, ``lakefold optimize`` and ``lakefold vacuum``: SQL and table upkeep.

Tables are named through the catalog (``lakefold._from_settings.table_catalog``): each
Delta-target projection at its live generation, over the Delta tables under the lake directory.
``optimize`` and ``vacuum`` also take a Delta table path.
"""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import io
import json
import sys
from dataclasses import asdict
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from lakefold.cli._common import app as _app
from lakefold.core.exceptions import EncodingError

if TYPE_CHECKING:  # pyarrow is imported by the commands that use it, not at CLI start
    import pyarrow as pa


class OutputFormat(StrEnum):
    TABLE = "table"
    JSON = "json"
    CSV = "csv"


class EngineChoice(StrEnum):
    SPARK = "spark"
    LOCAL = "local"


def _json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    raise EncodingError(f"cannot encode {type(value).__name__} as JSON")


def render(result: pa.Table, fmt: OutputFormat) -> str:
    """The result as a rich table, a JSON array of objects, or CSV with a header line."""
    records = result.to_pylist()
    if fmt is OutputFormat.JSON:
        return json.dumps(records, default=_json_default)
    if fmt is OutputFormat.CSV:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(result.column_names)
        for record in records:
            writer.writerow(
                ["" if v is None else (v if isinstance(v, str) else _cell(v))
                 for v in record.values()]
            )
        return buffer.getvalue().rstrip("\n")
    table = Table(show_lines=False)
    for name in result.column_names:
        table.add_column(name)
    for record in records:
        table.add_row(*["NULL" if v is None else _cell(v) for v in record.values()])
    console = Console(file=io.StringIO(), width=200, force_terminal=False)
    console.print(table)
    console.print(f"({result.num_rows} row{'s' if result.num_rows != 1 else ''})")
    output = console.file.getvalue()  # type: ignore[attr-defined]
    return str(output).rstrip("\n")


def _cell(value: Any) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value, default=_json_default)
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    return str(value)


def query(
    sql_text: Annotated[str, typer.Argument(metavar="SQL", help="The SQL statement.")],
    fmt: Annotated[OutputFormat, typer.Option(
        "--format", "-f", help="Output: table, json or csv.")] = OutputFormat.TABLE,
    engine: Annotated[EngineChoice, typer.Option(
        "--engine", "-e",
        help="spark: Spark SQL (full dialect). local: polars SQL in-process, no JVM (fast, "
             "for small interactive queries).")] = EngineChoice.SPARK,
) -> None:
    """Run SQL over every materialized table, each registered under its name."""
    from lakefold._from_settings import table_catalog
    from lakefold.settings import load_settings
    from lakefold.spark import Engine, run_query

    settings = load_settings()
    catalog = table_catalog(settings)
    if engine is EngineChoice.LOCAL:
        result = run_query(sql_text, catalog, engine=Engine.LOCAL)
    else:
        from lakefold._from_settings import session_from_settings

        spark = session_from_settings(settings, app_name="lakefold-query")
        try:
            result = run_query(sql_text, catalog, engine=Engine.SPARK, spark=spark)
        finally:
            spark.stop()
    sys.stdout.write(render(result, fmt) + "\n")


def optimize(
    table: Annotated[str, typer.Argument(help="Table name (from the catalog) or Delta path.")],
    target_size: Annotated[int | None, typer.Option(help="Target file size in bytes.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Compact a table's small files into larger ones (no row changes)."""
    from lakefold._from_settings import table_catalog
    from lakefold.settings import load_settings
    from lakefold.spark import optimize_table
    from lakefold.spark.operations import resolve_table

    path = resolve_table(table_catalog(load_settings()), table)
    result = optimize_table(path, target_size=target_size)
    if as_json:
        sys.stdout.write(json.dumps(asdict(result)) + "\n")
        return
    Console().print(
        f"{table}: {result.files_removed} files compacted into {result.files_added} "
        f"(version {result.version})", highlight=False)


def vacuum(
    table: Annotated[str, typer.Argument(help="Table name (from the catalog) or Delta path.")],
    retention_hours: Annotated[float, typer.Option(
        help="Keep files needed by versions this young (whole hours).")] = 168,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="List the files, delete nothing.")] = False,
    force: Annotated[bool, typer.Option(
        "--force", help="Allow a retention below the table's minimum.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Delete files no table version inside the retention window needs."""
    from lakefold._from_settings import table_catalog
    from lakefold.settings import load_settings
    from lakefold.spark import vacuum_table
    from lakefold.spark.operations import resolve_table

    path = resolve_table(table_catalog(load_settings()), table)
    result = vacuum_table(path, retention_hours=retention_hours, dry_run=dry_run,
                          enforce_retention=not force)
    if as_json:
        sys.stdout.write(json.dumps(asdict(result)) + "\n")
        return
    verb = "would delete" if dry_run else "deleted"
    Console().print(f"{table}: {verb} {len(result.files)} file(s)", highlight=False)
    for name in result.files:
        Console().print(f"  {name}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add query, optimize and vacuum to a typer app."""
    app.command()(query)
    app.command()(optimize)
    app.command()(vacuum)


register(_app)
