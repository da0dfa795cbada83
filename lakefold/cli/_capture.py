"""``lakefold capture run|streams|read|tail|compact|keep-history|release-reader|drop``:
change-data capture from the command line.

``run`` captures until interrupted (Ctrl-C or SIGTERM stop it cleanly: what was received is
stored and confirmed first), or with ``--until-current`` until everything committed when it
started is stored. DSNs come from ``--dsn`` / ``--store-dsn`` or the settings
(``LAKEFOLD_DSN``, ``LAKEFOLD_STORE_DSN``).
"""

from __future__ import annotations

import json
import math
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

from lakefold.cli._common import app as _app, print_table
from lakefold.core.exceptions import ConfigurationError

capture_app = typer.Typer(
    no_args_is_help=True,
    help="Change-data capture: stream a database's changes into changelog streams, read them.",
)
_out = Console()



def _checked(option: str) -> Any:
    """A typer callback that refuses a DSN libpq cannot read as written (one line)."""
    def check(value: str | None) -> str | None:
        if value:
            from lakefold.core.dsn import check_dsn

            check_dsn(value, what=option)
        return value
    return check


DsnOption = Annotated[str | None, typer.Option(
    "--dsn", help="Source database DSN (default: LAKEFOLD_DSN).", show_default=False,
    callback=_checked("--dsn"))]
StoreOption = Annotated[str | None, typer.Option(
    "--store-dsn", help="Changelog store DSN (default: LAKEFOLD_STORE_DSN, then LAKEFOLD_DSN).",
    show_default=False, callback=_checked("--store-dsn"))]
SlotOption = Annotated[str | None, typer.Option(
    help="Replication slot lakefold owns (default: lakefold_<database>, or `lakefold` for a "
         "capture that the store already records under that name).", show_default=False)]
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


def resolve_slot(slot: str | None, source_dsn: str | None, store_dsn: str | None) -> str:
    """The slot a command means: ``slot`` when given; else, for a source database, the slot
    ``lakefold`` when the store records a capture of that database under it (a capture made
    before slot names were per database keeps its slot), and otherwise
    ``lakefold_<database>``; without a source, the store's only capture."""
    if slot:
        return slot
    import psycopg

    from lakefold.capture import LEGACY_SLOT, StoreUnavailableError, slot_name_for
    from lakefold.core.dsn import connection_problem, mask_dsn

    database: str | None = None
    recorded: list[tuple[str, str]] = []
    for dsn, what in ((source_dsn, "source"), (store_dsn or source_dsn, "store")):
        if dsn is None:
            continue
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
                if what == "source":
                    row = conn.execute("SELECT current_database()").fetchone()
                    database = str(row[0]) if row else None
                elif conn.execute("SELECT to_regclass('lakefold.capture_slots')").fetchone() \
                        != (None,):
                    recorded = [(str(r[0]), str(r[1])) for r in conn.execute(
                        "SELECT slot_name, source_database FROM lakefold.capture_slots "
                        "ORDER BY slot_name").fetchall()]
        except psycopg.OperationalError as e:
            raise StoreUnavailableError(
                f"cannot connect to the {what} at {mask_dsn(dsn)}: "
                f"{connection_problem(e, dsn)}") from e
    if database is not None:
        if (LEGACY_SLOT, database) in recorded:
            return LEGACY_SLOT
        return slot_name_for(database)
    if len(recorded) == 1:
        return recorded[0][0]
    raise ConfigurationError(
        "which capture? pass --slot (the store records "
        + (", ".join(name for name, _ in recorded) or "none") + "), or set LAKEFOLD_DSN to its "
        "source database")


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
    slot: SlotOption = None,
    publication: PublicationOption = "lakefold",
    schema: Annotated[str | None, typer.Option(
        help="Capture every table of this schema that has a primary key (needs a "
             "superuser).", show_default=False)] = None,
    table: Annotated[list[str] | None, typer.Option(
        "--table", help="Capture this table (schema.table); repeat for more.",
        show_default=False)] = None,
    stream_prefix: Annotated[str, typer.Option(
        help="Prefix of the stream names (<prefix><schema>.<table>). A prefix belongs to one "
             "source: a second source captured into the same store needs its own, e.g. "
             "sales., and its own --slot.")] = "",
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
    take_over: Annotated[bool, typer.Option(
        "--take-over",
        help="If another capture runs on this slot, ask it to stop cleanly and take the slot "
             "over (without this, this capture refuses to start).")] = False,
    as_json: JsonOption = False,
) -> None:
    """Capture changes into changelog streams until interrupted (or --until-current).

    One capture runs per slot and store: a second one refuses and names the running one
    (host, pid, since when), unless started with --take-over."""
    from lakefold.capture import Capture, CaptureConfig, CompactionPolicy

    source = _source_dsn(dsn)
    store = store_dsn or _configured_store_dsn()
    slot = resolve_slot(slot, source, store)
    if schema is None and not table:  # a restart: what the publication covers
        schema, table = publication_scope(source, publication)
    config = CaptureConfig(
        source_dsn=source, store_dsn=store, slot=slot,
        publication=publication, schema=schema,
        tables=tuple(table or ()), stream_prefix=stream_prefix, streaming=streaming,
        keep_messages=keep_messages, take_over=take_over,
        compaction=CompactionPolicy(interval=parse_duration(compact_every),
                                    tombstone_retention=parse_duration(tombstone_retention))
        if compact_every else None,
    )
    until = _current_lsn(source) if until_current else None
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())

    def started() -> None:  # said once the checks passed: an error comes alone
        if not as_json:
            _out.print(f"capturing through slot [bold]{escape(slot)}[/] "
                       f"(publication {escape(publication)}); Ctrl-C stops cleanly")

    from lakefold.cli._common import SnapshotProgress

    with SnapshotProgress(enabled=not as_json) as progress:  # the initial snapshot's bars
        stats = Capture(config, listener=progress).run(stop=stop, until_lsn=until,
                                                       on_started=started)
    result = {"records": stats.records, "batches": stats.batches,
              "flushed_lsn": stats.flushed_lsn_text, "reconnects": stats.reconnects,
              "seconds": round(stats.elapsed_s, 3)}
    if as_json:
        typer.echo(json.dumps(result))
    else:
        _out.print(f"stored {stats.records:,} records in {stats.batches:,} batches; slot "
                   f"confirmed at {stats.flushed_lsn_text} ({stats.reconnects} reconnects)")


def publication_scope(dsn: str, publication: str) -> tuple[str | None, list[str]]:
    """What ``publication`` on the source covers, as ``--schema`` or ``--table`` would say it
    (so a capture or a recovery started again needs neither)."""
    import psycopg

    from lakefold.capture import StoreUnavailableError
    from lakefold.core.dsn import connection_problem, mask_dsn

    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            exists = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s",
                                  (publication,)).fetchone()
            schemas = [r[0] for r in conn.execute(
                "SELECT n.nspname FROM pg_publication_namespace pn JOIN pg_publication p "
                "ON p.oid = pn.pnpubid JOIN pg_namespace n ON n.oid = pn.pnnspid "
                "WHERE p.pubname = %s", (publication,)).fetchall()]
            tables = [f"{r[0]}.{r[1]}" for r in conn.execute(
                "SELECT n.nspname, c.relname FROM pg_publication_rel pr JOIN pg_publication p "
                "ON p.oid = pr.prpubid JOIN pg_class c ON c.oid = pr.prrelid "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE p.pubname = %s "
                "ORDER BY 1, 2", (publication,)).fetchall()]
    except psycopg.OperationalError as e:
        raise StoreUnavailableError(f"cannot connect to the source at {mask_dsn(dsn)}: "
                                    f"{connection_problem(e, dsn)}") from e
    if not exists:
        raise ConfigurationError(
            f"say what to capture: publication {publication!r} does not exist yet; pass "
            "--table schema.table (repeat for more) or --schema NAME")
    if len(schemas) == 1 and not tables:
        return schemas[0], []
    if tables and not schemas:
        return None, tables
    raise ConfigurationError(
        f"cannot tell what publication {publication!r} captures; pass --schema or --table")


def _current_lsn(dsn: str) -> int:
    import psycopg

    from lakefold.capture import StoreUnavailableError, parse_lsn
    from lakefold.core.dsn import connection_problem, mask_dsn

    try:
        with psycopg.connect(dsn, connect_timeout=10) as conn:
            row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    except psycopg.OperationalError as e:
        raise StoreUnavailableError(f"cannot connect to the source at {mask_dsn(dsn)}: "
                                    f"{connection_problem(e, dsn)}") from e
    return parse_lsn(row[0] if row else "0/0")


@capture_app.command("streams")
def streams(store_dsn: StoreOption = None, as_json: JsonOption = False) -> None:
    """List the changelog streams of every capture in the store (each with its slot and
    source, host:port/database) with their heads and schema versions, how far each is
    compacted and what holds its compaction (the durable reader with the lowest position)."""
    from lakefold.capture import ChangelogStore

    with ChangelogStore(_store_dsn(store_dsn)) as store:
        infos = store.streams()
        compaction = {s.name: store.compaction_state(s.name) for s in infos}
    if as_json:
        typer.echo(json.dumps([{
            "name": s.name, "slot": s.slot, "source": s.source, "database": s.database,
            "schema": s.schema,
            "table": s.table, "head": s.head, "schema_version": s.schema_version,
            "last_commit_ts": s.last_commit_ts.isoformat() if s.last_commit_ts else None,
            "compaction": compaction[s.name].as_dict(),
        } for s in infos]))
        return
    table = Table(title="changelog streams")
    for column in ("stream", "slot", "source", "head", "schema", "last commit",
                   "compacted to"):
        table.add_column(column)
    for s in infos:
        table.add_row(escape(s.name), escape(s.slot), escape(s.source or "-"), f"{s.head:,}",
                      f"v{s.schema_version}",
                      str(s.last_commit_ts or "-"), f"{compaction[s.name].compacted_to:,}")
    print_table(_out, table)
    for name, state in compaction.items():  # what holds each stream's compaction
        holder = state.held_by
        if state.keep_history:
            _out.print(f"{escape(name)}: keeps its full history, not compacted "
                       f"({escape(state.keep_history_reason or '')})", soft_wrap=True)
        elif holder is not None:
            _out.print(f"{escape(name)}: compaction held at position {holder.position:,} by "
                       f"{escape(holder.reader)} (not moved since "
                       f"{holder.moved_at:%Y-%m-%d %H:%M:%S %Z})", soft_wrap=True)


def _json_safe(value: Any) -> Any:
    """``value`` with what ``json.dumps`` would write as invalid or ambiguous JSON replaced:
    a non-finite float by PostgreSQL's spelling (``"NaN"``, ``"Infinity"``, ``"-Infinity"``),
    a tuple with named fields (Arrow's interval, ``MonthDayNano``) by an object of them."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    fields = getattr(type(value), "__match_args__", None)
    if isinstance(value, tuple) and fields:
        return {field: _json_safe(getattr(value, field)) for field in fields}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    return value


def _print_records(records: list[dict[str, Any]], *, as_json: bool, title: str) -> None:
    if as_json:
        for record in records:
            sys.stdout.write(json.dumps(_json_safe(record), default=_json_value,
                                        allow_nan=False) + "\n")
        sys.stdout.flush()
        return
    table = Table(title=title)
    columns = list(records[0]) if records else ["_position"]
    for column in columns:
        table.add_column(column)
    for record in records:
        table.add_row(*(escape(str(record[c])) for c in columns))
    print_table(_out, table)


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


@capture_app.command("keep-history")
def keep_history(
    stream: Annotated[str, typer.Argument(help="The stream, e.g. public.orders.")],
    store_dsn: StoreOption = None,
    off: Annotated[bool, typer.Option(
        "--off", help="Let compaction trim the stream again (history views registered "
        "later leave it so).")] = False,
) -> None:
    """Keep a stream's full history: compaction leaves it alone, so history views (SCD2,
    append) over it can be rebuilt. Registering such a view does this by itself."""
    from lakefold.capture import ChangelogStore

    with ChangelogStore(_store_dsn(store_dsn)) as store:
        store.keep_history(stream, not off, reason="set with `lakefold capture keep-history"
                           + (" --off`" if off else "`"))
        state = store.compaction_state(stream)
    if off:
        _out.print(f"{escape(stream)} is compacted again; history views over it can no longer "
                   "be rebuilt once compaction removes records")
    elif state.removed_to:
        _out.print(f"{escape(stream)} keeps its history from now on; compaction already "
                   f"removed records up to position {state.removed_to:,}, which stay removed")
    else:
        _out.print(f"{escape(stream)} keeps its full history")


@capture_app.command("release-reader")
def release_reader(
    reader: Annotated[str, typer.Argument(help="The reader (see `lakefold capture streams`).")],
    store_dsn: StoreOption = None,
) -> None:
    """Forget a durable reader that is gone for good, so that it no longer holds compaction.
    A reader that comes back later is checked, and told to rebuild if it missed records."""
    from lakefold.capture import ChangelogStore

    with ChangelogStore(_store_dsn(store_dsn)) as store:
        released = store.release_reader(reader)
        known = sorted({r.reader for r in store.readers()})
    if not released:
        raise ConfigurationError(
            f"no durable reader {reader!r} in this store; readers: "
            f"{', '.join(known) if known else 'none'}")
    _out.print(f"released {escape(reader)} from {released} stream(s)")


@capture_app.command("drop")
def drop(
    dsn: DsnOption = None,
    store_dsn: StoreOption = None,
    slot: SlotOption = None,
    publication: PublicationOption = "lakefold",
) -> None:
    """Drop the capture's slot and publication (streams and records stay in the store)."""
    from lakefold.capture.operations import drop_capture

    source = _source_dsn(dsn)
    store = store_dsn or _store_dsn(None, source)
    slot = resolve_slot(slot, source, store)
    drop_capture(source, store, slot=slot, publication=publication)
    _out.print(f"dropped slot {escape(slot)} and publication {escape(publication)}")


_app.add_typer(capture_app, name="capture")
