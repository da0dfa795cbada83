"""``lakefold events install|status|seal|tail|append|delete|read|streams``: the event store
from the command line.

``append STREAM TYPE --data JSON [--expected-version N]`` appends one event (any JSON payload:
the command line has no registry); ``delete STREAM [--hard]`` deletes a stream (soft: its
events hidden, kept for replays; hard: erased); ``read STREAM | --category C | --all [--from
P]`` prints events in order (a stream by version, the others by global position); ``streams``
lists the streams with their versions. Bad input (an unknown stream, JSON that does not
parse, a stale expected version) is one line on stderr and exit code 1, nothing written.

``tail`` is an ephemeral subscription (no checkpoint): it prints events as they become visible
to global readers, one line each (``--json``: one JSON object per line), until interrupted or,
with ``--idle-timeout``, until nothing new arrives for that long. ``status`` shows the head, the
events waiting for the visibility watermark and, when it is held longer than the threshold, the
transaction that holds it (exit code 2 in that case, so monitors can alert on it), and how
much of the log is sealed. ``seal`` seals every complete range of the log that has no segment
yet (each ``EventStore`` does so in the background; this is for a store loaded or upgraded
without one running).
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

import typer
from rich.console import Console
from rich.markup import escape

from lakefold.cli._common import app as _app
from lakefold.core.exceptions import ConfigurationError, EncodingError

events_app = typer.Typer(
    no_args_is_help=True,
    help="The event store: install its schema, append, read and tail events, list and delete "
         "streams.",
)

DsnOption = Annotated[
    str | None,
    typer.Option("--dsn", help="Event store DSN (default: LAKEFOLD_STORE_DSN, then "
                               "LAKEFOLD_DSN).", show_default=False),
]


def _resolve_dsn(dsn: str | None) -> str:
    if dsn:
        return dsn
    from lakefold.settings import load_settings

    resolved = load_settings().resolved_store_dsn()
    if not resolved:
        raise ConfigurationError(
            "no event store DSN: pass --dsn or set LAKEFOLD_STORE_DSN (or LAKEFOLD_DSN)"
        )
    return resolved


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    raise EncodingError(f"cannot serialise {type(value).__name__}")


@events_app.command("install")
def install(dsn: DsnOption = None) -> None:
    """Create the event store's tables and functions in schema lakefold (idempotent)."""
    from lakefold.eventstore import EventStore

    with EventStore(_resolve_dsn(dsn)) as store:
        store.install()
    Console(stderr=True).print("event store installed")


@events_app.command("status")
def status(
    dsn: DsnOption = None,
    threshold: Annotated[float, typer.Option(
        help="Report the watermark as held after this many seconds.")] = 5.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Head, events waiting for the watermark, and who holds it."""
    from lakefold.eventstore import EventStore, StoreOptions

    with EventStore(_resolve_dsn(dsn),
                    options=StoreOptions(watermark_threshold_s=threshold)) as store:
        current = store.status()
    if as_json:
        sys.stdout.write(json.dumps(current.as_dict()) + "\n")
    else:
        console = Console()
        console.print(f"head position      {current.head}")
        console.print(f"pending events     {current.pending_events}")
        console.print(f"last sequenced at  {current.sequenced_at or '-'}")
        if current.held and current.holder is not None:
            console.print(f"[bold red]watermark held[/] by {escape(current.holder.describe())}")
        else:
            console.print("watermark          ok")
        console.print(f"sealed segments    {current.segments}")
        console.print(f"unsealed positions {current.unsealed_positions}")
    if current.held:
        raise typer.Exit(code=2)


@events_app.command("seal")
def seal(
    dsn: DsnOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Seal every complete range of the log that has no segment yet (for fast bulk reads)."""
    from rich.progress import Progress

    from lakefold.eventstore import EventStore, StoreOptions

    with EventStore(_resolve_dsn(dsn), options=StoreOptions(seal_segments=False)) as store, \
            Progress(console=Console(stderr=True), transient=True,
                     disable=as_json or not sys.stderr.isatty()) as bar:
        task = bar.add_task("sealing", total=None)
        sealed = store.seal(progress=lambda done, total: bar.update(task, completed=done,
                                                                    total=total))
    result = {"segments": sealed.segments, "events": sealed.events, "head": sealed.head,
              "interrupted": sealed.interrupted}
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        Console().print(f"sealed {sealed.segments} segments ({sealed.events} events) up to "
                        f"position {sealed.head}"
                        + (" (stopped: a stream deletion was under way; run again)"
                           if sealed.interrupted else ""))


def _line(event: Any) -> str:
    data = json.dumps(event.data, separators=(",", ":"), default=_json_default)
    position = "-" if event.position is None else event.position  # not sequenced yet
    return f"{position:>10}  {event.stream_id}@{event.stream_version}  {event.type}  {data}"


def _record(event: Any) -> dict[str, Any]:
    meta = event.metadata
    return {
        "position": event.position, "event_id": event.event_id, "stream_id": event.stream_id,
        "stream_version": event.stream_version, "type": event.type,
        "schema_version": event.schema_version, "data": event.data,
        "metadata": {"correlation_id": meta.correlation_id, "causation_id": meta.causation_id,
                     **meta.extra},
        "recorded_at": event.recorded_at,
    }


@events_app.command("tail")
def tail(
    dsn: DsnOption = None,
    category: Annotated[str | None, typer.Option(
        help="Only streams of this category (e.g. 'order').")] = None,
    types: Annotated[list[str] | None, typer.Option(
        "--type", help="Only this event type (repeatable).")] = None,
    from_position: Annotated[int | None, typer.Option(
        min=0, help="Start at this position (inclusive) instead of after the head.")] = None,
    limit: Annotated[int | None, typer.Option(
        min=1, help="Stop after this many events.")] = None,
    idle_timeout: Annotated[float | None, typer.Option(
        min=0, help="Stop when nothing new arrives for this many seconds.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """Print events as they become visible, without a checkpoint."""
    from lakefold.eventstore import EventStore, SubscriptionOptions

    options = SubscriptionOptions(category=category, types=tuple(types) if types else None,
                                  poll_interval_s=1.0)
    printed = 0
    with EventStore(_resolve_dsn(dsn), options=_tail_options()) as store, store.tail(
        options, from_position=from_position
    ) as subscription:
        for event in subscription.events(idle_timeout_s=idle_timeout):
            if as_json:
                sys.stdout.write(json.dumps(_record(event), default=_json_default) + "\n")
            else:
                sys.stdout.write(_line(event) + "\n")
            sys.stdout.flush()
            printed += 1
            if limit is not None and printed >= limit:
                break


@events_app.command("append")
def append(
    stream: Annotated[str, typer.Argument(help="The stream, CATEGORY-ID (e.g. order-42).")],
    event_type: Annotated[str, typer.Argument(metavar="TYPE", help="The event type.")],
    data: Annotated[str, typer.Option("--data", help="The payload, a JSON object.")],
    expected_version: Annotated[int | None, typer.Option(
        min=0, help="Append only if the stream is at this version (0: a new stream).")] = None,
    schema_version: Annotated[int, typer.Option(
        min=1, help="The payload's schema version.")] = 1,
    dsn: DsnOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Append one event to a stream."""
    from lakefold.eventstore import ANY, NO_STREAM, EventStore, InvalidRequestError
    from lakefold.schemas import NewEvent

    try:
        payload = json.loads(data)
    except json.JSONDecodeError as e:
        raise InvalidRequestError(f"--data is not JSON ({e}); give an object, e.g. "
                                  '\'{"amount": 10}\'') from e
    if not isinstance(payload, dict):
        raise InvalidRequestError(f"--data must be a JSON object, not {type(payload).__name__}")
    expected = ANY if expected_version is None else \
        NO_STREAM if expected_version == 0 else expected_version
    with EventStore(_resolve_dsn(dsn), options=_tail_options()) as store:
        result = store.append(stream, [NewEvent(type=event_type, data=payload,
                                                schema_version=schema_version)],
                              expected_version=expected)
        result = store.wait_for_positions(result)  # visible to global readers on return
    appended = result.events[0]
    if as_json:
        sys.stdout.write(json.dumps({"stream_id": appended.stream_id,
                                     "stream_version": appended.stream_version,
                                     "event_id": str(appended.event_id),
                                     "position": appended.position,
                                     "duplicate": result.duplicate}) + "\n")
    else:
        Console().print(f"appended {escape(appended.stream_id)}@{appended.stream_version} "
                        f"at position {appended.position} ({appended.event_id})")


@events_app.command("delete")
def delete(
    stream: Annotated[str, typer.Argument(help="The stream, CATEGORY-ID (e.g. order-42).")],
    hard: Annotated[bool, typer.Option(
        "--hard", help="Erase its events (erasure requests); default: hide them, kept for "
                       "replays.")] = False,
    expected_version: Annotated[int | None, typer.Option(
        min=1, help="Delete only if the stream is at this version.")] = None,
    dsn: DsnOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Delete a stream (appends its deletion record): projections receive the deletion, and
    views take the stream's events out of their rows, windows included."""
    from lakefold.eventstore import ANY, EventStore, InvalidRequestError

    with EventStore(_resolve_dsn(dsn), options=_tail_options()) as store:
        if not store.stream_state(stream).exists:
            raise InvalidRequestError(
                f"stream {stream!r} has no events; `lakefold events streams` lists them")
        record = store.delete_stream(
            stream, expected_version=ANY if expected_version is None else expected_version,
            hard=hard)
    how = "hard" if hard else "soft"
    if as_json:
        sys.stdout.write(json.dumps({"stream_id": record.stream_id,
                                     "stream_version": record.stream_version,
                                     "hard": hard}) + "\n")
    else:
        Console().print(f"deleted {escape(record.stream_id)} ({how}) with its deletion record "
                        f"at version {record.stream_version}")


@events_app.command("read")
def read(
    stream: Annotated[str | None, typer.Argument(help="A stream (CATEGORY-ID).")] = None,
    category: Annotated[str | None, typer.Option(help="Every stream of a category.")] = None,
    read_all: Annotated[bool, typer.Option("--all", help="The whole log.")] = False,
    from_: Annotated[int, typer.Option(
        "--from", min=0, help="From this stream version (a stream) or global position.")] = 0,
    limit: Annotated[int, typer.Option(min=1, help="At most this many events.")] = 100,
    dsn: DsnOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """Print events: of one stream in version order, or of a category or the whole log in
    global order."""
    from lakefold.eventstore import EventStore, InvalidRequestError

    if sum((stream is not None, category is not None, read_all)) != 1:
        raise InvalidRequestError("read one of: a STREAM, --category C, or --all")
    with EventStore(_resolve_dsn(dsn), options=_tail_options()) as store:
        if stream is not None:
            if not store.stream_state(stream).exists:
                raise InvalidRequestError(
                    f"stream {stream!r} has no events; `lakefold events streams` lists them")
            events = store.read_stream(stream, from_version=max(from_, 1), limit=limit)
        elif category is not None:
            events = store.read_category(category, from_position=from_, limit=limit)
        else:
            events = store.read_all(from_position=from_, limit=limit)
    for event in events:
        if as_json:
            sys.stdout.write(json.dumps(_record(event), default=_json_default) + "\n")
        else:
            sys.stdout.write(_line(event) + "\n")


@events_app.command("streams")
def streams(
    category: Annotated[str | None, typer.Option(help="Only this category.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many streams.")] = 1000,
    dsn: DsnOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON array.")] = False,
) -> None:
    """List the streams (id, category, version, deleted), in id order."""
    from rich.table import Table

    from lakefold.eventstore import list_streams

    found = list_streams(_resolve_dsn(dsn), category, limit=limit)
    if as_json:
        sys.stdout.write(json.dumps([{"stream_id": s.stream_id, "category": s.category,
                                      "version": s.version, "deleted": s.deleted,
                                      "updated_at": s.updated_at} for s in found],
                                    default=_json_default) + "\n")
        return
    table = Table("stream", "category", "version", "deleted", "updated")
    for s in found:
        table.add_row(escape(s.stream_id), escape(s.category), f"{s.version:,}",
                      s.deleted or "", s.updated_at.isoformat(timespec="seconds"))
    Console().print(table)


def _tail_options() -> Any:
    from lakefold.eventstore import StoreOptions

    return StoreOptions(pool_size=2, application_name="lakefold-events-tail")


_app.add_typer(events_app, name="events")
