"""``lakefold late list|replay VIEW``: the events a windowed view did not count because their
window had closed (see ``lakefold.projections`` on windows), and folding them back in.

``list`` shows them newest first (``--json``: one array); ``replay`` marks them (all, or
``--position P`` ones) to be counted: the view's next batch corrects their windows, and
downstream views and targets follow. An unknown view is one line on stderr, exit code 1.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lakefold.cli._common import app, print_table
from lakefold.cli._projections import JsonOption, _catalog, _settings, _store_dsn

late_app = typer.Typer(no_args_is_help=True,
                       help="Late events: what a windowed view did not count, and replaying "
                            "it.")
app.add_typer(late_app, name="late")
_out = Console()


def _known(view: str) -> str:
    """The store DSN, once the view is known to the catalog (else a clear error)."""
    settings = _settings()
    with _catalog(settings) as catalog:
        catalog.current(view)
    return _store_dsn(settings)


@late_app.command("list")
def late_list(
    view: Annotated[str, typer.Argument(help="The windowed view.")],
    state: Annotated[str | None, typer.Option(
        "--status", help="late or replayed.", show_default=False)] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 100,
    as_json: JsonOption = False,
) -> None:
    """List a view's late events: the window each missed, the watermark, how late."""
    from lakefold.projections.operations import late_events

    found = late_events(_known(view), view, status=state, limit=limit)
    if as_json:
        typer.echo(json.dumps([e.as_json() for e in found]))
        return
    table = Table(title=f"late events of {escape(view)}")
    for column in ("position", "input", "event time", "window", "watermark", "late by",
                   "status"):
        table.add_column(column)
    for e in found:
        table.add_row(str(e.position), escape(e.input), e.event_time.isoformat(),
                      f"{e.window_start.isoformat()} to {e.window_end.time().isoformat()}",
                      e.watermark.isoformat(), f"{e.late_by_seconds:,.1f} s", e.status)
    print_table(_out, table)


@late_app.command("replay")
def late_replay(
    view: Annotated[str, typer.Argument(help="The windowed view.")],
    positions: Annotated[list[int] | None, typer.Option(
        "--position", help="Only the late events at these global positions (repeatable).",
        show_default=False)] = None,
) -> None:
    """Count a view's late events in their windows after all (at its next batch)."""
    from lakefold.projections.operations import replay_late_events

    done = replay_late_events(_known(view), view, positions or None)
    _out.print(f"{done} late event window(s) of {escape(view)} will be counted at its next "
               "batch" if done else f"no late events of {escape(view)} to replay")
