"""``lakefold capture run|streams|read|tail|compact|drop``: change-data capture from the
command line.

``run`` captures until interrupted (Ctrl-C or SIGTERM stop it cleanly: what was received is
stored and confirmed first), or with ``--until-current`` until everything committed when it
started is stored. DSNs come from ``--dsn`` / ``--store-dsn`` or the settings
(``LAKEFOLD_DSN``, ``LAKEFOLD_STORE_DSN``).
"""

from __future__ import annotations

import json
import re
import signal
import sys
import threading
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Annotated, Any
from uuid import UUID

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lakefold.exceptions import ConfigurationError

capture_app = typer.Typer(
    no_args_is_help=True,
    help="Change-data capture: stream a database's changes into changelog streams, read them.",
)
_out = Console()

DsnOption = Annotated[str | None, typer.Option(
    "--dsn", help="Source database DSN (default: LAKEFOLD_DSN).", show_default=False)]
StoreOption = Annotated[str | None, typer.Option(
    "--store-dsn", help="Changelog store DSN (default: LAKEFOLD_STORE_DSN, then LAKEFOLD_DSN).",
    show_default=False)]
SlotOption = Annotated[str, typer.Option(help="Replication slot lakefold owns.")]
PublicationOption = Annotated[str, typer.Option(help="Publication lakefold owns.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")


def parse_duration(text: str) -> timedelta:
    """``90`` or ``90s``, ``15m``, ``24h``, ``7d`` as a timedelta."""
    match = _DURATION.match(text)
    if match is None:
        raise ConfigurationError(
            f"duration {text!r} is not understood; write a number with s, m, h or d, e.g. 24h")
    value = float(match[1])
    unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}[match[2] or "s"]
    return timedelta(seconds=value * unit)


def _source_dsn(dsn: str | None) -> str:
    if dsn:
        return dsn
    from lakefold.settings import load_settings

    resolved = load_settings().source_dsn()
    if not resolved:
        raise ConfigurationError("no source DSN: pass --dsn or set LAKEFOLD_DSN")
    return resolved


def _store_dsn(store_dsn: str | None, dsn: str | None = None) -> str:
    if store_dsn:
        return store_dsn
    from lakefold.settings import load_settings

    settings = load_settings()
    resolved = dsn or settings.resolved_store_dsn()
    if not resolved:
        raise ConfigurationError(
            "no store DSN: pass --store-dsn or set LAKEFOLD_STORE_DSN (or LAKEFOLD_DSN)")
    return resolved


def _configured_store_dsn() -> str | None:
    """LAKEFOLD_STORE_DSN when set (None: the store is the source database)."""
    from lakefold.settings import load_settings

    secret = load_settings().store_dsn
    return secret.get_secret_value() if secret is not None else None


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal | UUID):
        return str(value)
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if isinstance(value, timedelta):
        return value.total_seconds()
    return str(value)


@capture_app.command("run")
def run(
    dsn: DsnOption = None,
    store_dsn: StoreOption = None,
    slot: SlotOption = "lakefold",
    publication: PublicationOption = "lakefold",
    schema: Annotated[str | None, typer.Option(
        help="Capture every table of this schema.", show_default=False)] = None,
    table: Annotated[list[str] | None, typer.Option(
        "--table", help="Capture this table (schema.table); repeat for more.",
        show_default=False)] = None,
    stream_prefix: Annotated[str, typer.Option(help="Prefix of the stream names.")] = "",
    streaming: Annotated[bool, typer.Option(
        help="Receive large transactions while they run (protocol v2) instead of after the "
             "server spilled them.")] = False,
    keep_messages: Annotated[bool, typer.Option(
        help="Store logical decoding messages too.")] = False,
    until_current: Annotated[bool, typer.Option(
        help="Stop once everything committed before the start is stored.")] = False,
    compact_every: Annotated[str | None, typer.Option(
        help="Compact the streams in the background this often, e.g. 5m.",
        show_default=False)] = None,
    tombstone_retention: Annotated[str, typer.Option(
        help="Keep tombstones this long when compacting.")] = "24h",
    as_json: JsonOption = False,
) -> None:
    """Capture changes into changelog streams until interrupted (or --until-current)."""
    from lakefold.capture import Capture, CaptureConfig, CompactionPolicy

    source = _source_dsn(dsn)
    config = CaptureConfig(
        source_dsn=source, store_dsn=store_dsn or _configured_store_dsn(), slot=slot,
        publication=publication, schema=schema,
        tables=tuple(table or ()), stream_prefix=stream_prefix, streaming=streaming,
        keep_messages=keep_messages,
        compaction=CompactionPolicy(interval=parse_duration(compact_every),
                                    tombstone_retention=parse_duration(tombstone_retention))
        if compact_every else None,
    )
    until = _current_lsn(source) if until_current else None
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    if not as_json:
        _out.print(f"capturing through slot [bold]{escape(slot)}[/] "
                   f"(publication {escape(publication)}); Ctrl-C stops cleanly")
    from lakefold._cli_snapshots import SnapshotProgress

    with SnapshotProgress(enabled=not as_json) as progress:  # the initial snapshot's bars
        stats = Capture(config, listener=progress).run(stop=stop, until_lsn=until)
    result = {"records": stats.records, "batches": stats.batches,
              "flushed_lsn": stats.flushed_lsn_text, "reconnects": stats.reconnects,
              "seconds": round(stats.elapsed_s, 3)}
    if as_json:
        typer.echo(json.dumps(result))
    else:
        _out.print(f"stored {stats.records:,} records in {stats.batches:,} batches; slot "
                   f"confirmed at {stats.flushed_lsn_text} ({stats.reconnects} reconnects)")


def _current_lsn(dsn: str) -> int:
    import psycopg

    from lakefold.capture import StoreUnavailableError, parse_lsn
    from lakefold.dsn import mask_dsn

    try:
        with psycopg.connect(dsn, connect_timeout=10) as conn:
            row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    except psycopg.OperationalError as e:
        raise StoreUnavailableError(f"cannot connect to the source at {mask_dsn(dsn)}: "
                                    f"{str(e).strip()}") from e
    return parse_lsn(row[0] if row else "0/0")


@capture_app.command("streams")
def streams(store_dsn: StoreOption = None, as_json: JsonOption = False) -> None:
    """List the changelog streams with their heads and schema versions."""
    from lakefold.capture import ChangelogStore

    with ChangelogStore(_store_dsn(store_dsn)) as store:
        infos = store.streams()
    if as_json:
        typer.echo(json.dumps([{
            "name": s.name, "slot": s.slot, "database": s.database, "schema": s.schema,
            "table": s.table, "head": s.head, "schema_version": s.schema_version,
            "last_commit_ts": s.last_commit_ts.isoformat() if s.last_commit_ts else None,
        } for s in infos]))
        return
    table = Table(title="changelog streams")
    for column in ("stream", "slot", "head", "schema", "last commit"):
        table.add_column(column)
    for s in infos:
        table.add_row(escape(s.name), escape(s.slot), f"{s.head:,}", f"v{s.schema_version}",
                      str(s.last_commit_ts or "-"))
    _out.print(table)


def _print_records(records: list[dict[str, Any]], *, as_json: bool, title: str) -> None:
    if as_json:
        for record in records:
            sys.stdout.write(json.dumps(record, default=_json_value) + "\n")
        sys.stdout.flush()
        return
    table = Table(title=title)
    columns = list(records[0]) if records else ["_position"]
    for column in columns:
        table.add_column(column)
    for record in records:
        table.add_row(*(escape(str(record[c])) for c in columns))
    _out.print(table)


@capture_app.command("read")
def read(
    stream: Annotated[str, typer.Argument(help="The stream, e.g. public.orders.")],
    store_dsn: StoreOption = None,
    from_position: Annotated[int, typer.Option(
        "--from", help="First position to read (inclusive; positions start at 1).")] = 1,
    limit: Annotated[int, typer.Option(help="At most this many records.")] = 20,
    as_json: JsonOption = False,
) -> None:
    """Print records of a stream (typed columns)."""
    from lakefold.capture import ChangelogStore

    with ChangelogStore(_store_dsn(store_dsn)) as store:
        records = store.read(stream, from_position, limit).to_pylist()
    _print_records(records, as_json=as_json, title=f"{stream} from position {from_position}")


@capture_app.command("tail")
def tail(
    stream: Annotated[str, typer.Argument(help="The stream to follow.")],
    store_dsn: StoreOption = None,
    from_position: Annotated[int | None, typer.Option(
        "--from", help="Start here (default: after the current head).", show_default=False)]
    = None,
) -> None:
    """Follow a stream: print each new record as one JSON line until interrupted."""
    from lakefold.capture import ChangelogStore

    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with ChangelogStore(_store_dsn(store_dsn)) as store:
        start = from_position if from_position is not None else store.head(stream) + 1
        try:
            for table in store.follow(stream, start, stop=stop):
                _print_records(table.to_pylist(), as_json=True, title=stream)
        except KeyboardInterrupt:
            return


@capture_app.command("compact")
def compact(
    stream: Annotated[str | None, typer.Argument(help="Only this stream.")] = None,
    store_dsn: StoreOption = None,
    tombstone_retention: Annotated[str, typer.Option(
        help="Keep tombstones this long, e.g. 24h; 0 removes them all.")] = "24h",
    as_json: JsonOption = False,
) -> None:
    """Keep the latest record per key and drop expired tombstones (online)."""
    from lakefold.capture import ChangelogStore

    with ChangelogStore(_store_dsn(store_dsn)) as store:
        removed = store.compact(stream, tombstone_retention=parse_duration(tombstone_retention))
    if as_json:
        typer.echo(json.dumps({"removed": removed}))
        return
    for name, count in removed.items():
        _out.print(f"{escape(name)}: removed {count:,} superseded records")


@capture_app.command("drop")
def drop(
    dsn: DsnOption = None,
    store_dsn: StoreOption = None,
    slot: SlotOption = "lakefold",
    publication: PublicationOption = "lakefold",
) -> None:
    """Drop the capture's slot and publication (streams and records stay in the store)."""
    from lakefold.capture._capture import drop_capture

    source = _source_dsn(dsn)
    drop_capture(source, store_dsn or _store_dsn(None, source), slot=slot,
                 publication=publication)
    _out.print(f"dropped slot {escape(slot)} and publication {escape(publication)}")


from lakefold.cli import app as _app  # noqa: E402

_app.add_typer(capture_app, name="capture")
