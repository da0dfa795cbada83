"""What the command modules share: the root ``app`` they add their commands to, and the
snapshot progress bars of ``lakefold capture run`` and ``lakefold capture resnapshot``.

``lakefold.cli`` imports the command modules after its own commands, so the order of the help
stays: demo, the projection commands, query/optimize/vacuum, then the groups.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from types import TracebackType

import typer
from rich.console import Console
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: no <bool> after flags, sentences re-flowed
    add_completion=False,
    help="lakefold: change-data capture and event sourcing on PostgreSQL, projected by Spark.",
)
_err = Console(stderr=True)


def _print_version(asked: bool) -> None:
    if asked:
        from importlib.metadata import version

        typer.echo(f"lakefold {version('lakefold')}")
        raise typer.Exit


@app.callback()
def _root(version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version,
        help="Print lakefold's version and exit.")) -> None:
    """lakefold: change-data capture and event sourcing on PostgreSQL, projected by Spark."""


def print_table(console: Console, table: Table) -> None:
    """Print ``table`` whole: names are never cut. On a terminal it keeps the terminal's
    width (a long name folds onto the next line); elsewhere (a pipe, a log) it is as wide as
    its rows need."""
    if console.is_terminal:
        for column in table.columns:
            column.overflow = "fold"
        console.print(table)
        return
    natural = Measurement.get(console, console.options.update(max_width=1 << 16), table).maximum
    width = console.width
    console.width = max(natural, width)
    try:
        console.print(table)
    finally:
        console.width = width


class SnapshotProgress(AbstractContextManager["SnapshotProgress"]):
    """A rich progress bar per table with rows copied and rows/s (a ``SnapshotListener``);
    drawn on stderr so that ``--json`` output stays clean. The bars are shown only while a
    snapshot copies rows (a long-running capture keeps its terminal), and only on a
    terminal: in a redirected log each table gets one line when it is done instead of bars
    drawn again and again."""

    def __init__(self, *, enabled: bool = True) -> None:
        self._lines = enabled and not _err.is_terminal
        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
            console=_err, disable=not enabled or self._lines, transient=False)
        self._tasks: dict[str, tuple[TaskID, float, int]] = {}
        self._open = 0
        self._live = False

    def __enter__(self) -> SnapshotProgress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._live:
            self._progress.stop()
            self._live = False

    def table_started(self, table: str, estimated_rows: int, done_rows: int) -> None:
        if not self._live:
            self._progress.start()
            self._live = True
        self._open += 1
        task = self._progress.add_task(table, total=max(estimated_rows, done_rows, 1),
                                       completed=done_rows, rate="")
        self._tasks[table] = (task, time.monotonic(), 0)

    def rows_copied(self, table: str, rows: int) -> None:
        task, started, copied = self._tasks[table]
        copied += rows
        self._tasks[table] = (task, started, copied)
        elapsed = max(time.monotonic() - started, 1e-6)
        current = self._progress.tasks[self._tasks_index(task)]
        total = max(current.total or 0, current.completed + rows)
        self._progress.update(task, advance=rows, total=total,
                              rate=f"{copied / elapsed:,.0f} rows/s")

    def table_done(self, table: str, rows: int) -> None:
        task, started, _ = self._tasks[table]
        if self._lines:
            _err.print(f"snapshot of {table}: {rows:,} rows in "
                       f"{time.monotonic() - started:.1f} s", highlight=False, markup=False)
        self._progress.update(task, total=rows, completed=rows)
        self._open -= 1
        if self._open <= 0 and self._live:
            self._progress.stop()
            self._live = False

    def _tasks_index(self, task: TaskID) -> int:
        return next(i for i, t in enumerate(self._progress.tasks) if t.id == task)
