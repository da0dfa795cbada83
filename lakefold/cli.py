"""The ``lakefold`` command line. Errors print one line saying what to fix; exit code 1."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.markup import escape

from lakefold._bench import bench_app
from lakefold.exceptions import LakefoldError

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    help="lakefold: change-data capture and event sourcing on PostgreSQL, projected by Spark.",
)
app.add_typer(bench_app, name="bench")
_stderr = Console(stderr=True)


@app.command()
def demo(
    rows: int = typer.Option(2_000, help="How many orders the demo workload writes."),
) -> None:
    """Start local services, capture a shop database, project revenue per customer into Delta,
    and query it back."""
    from lakefold._demo import run_demo
    from lakefold.settings import load_settings

    run_demo(load_settings(), orders=rows)


def main() -> None:
    """Entry point: run the CLI, turning lakefold errors into a one-line message."""
    if sys.argv[1:2] == ["bench"]:  # the benchmarks' imports are heavy: only when asked for
        from lakefold._bench import register_benchmarks

        register_benchmarks()
    try:
        app()
    except LakefoldError as e:
        _stderr.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        _stderr.print("interrupted")
        sys.exit(130)


# Command groups live in their own modules and register themselves on `app` when imported.
from lakefold import (  # noqa: E402
    _cli_capture,  # noqa: F401  (capture run, streams, read, tail, compact, drop)
    _cli_events,  # noqa: F401  (events install, status, tail)
    _cli_projections,  # noqa: F401  (run, rebuild, pause, resume, status, dlq, search)
    _cli_snapshots,  # noqa: F401  (capture resnapshot, status, pause, resume, recover)
    _cli_spark,  # noqa: F401  (query, optimize, vacuum)
)
