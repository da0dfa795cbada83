"""``lakefold capture resnapshot|status|pause|resume|recover``: snapshots and slot operations.

``resnapshot`` re-reads tables into their streams while the capture keeps streaming, with a
progress bar and rows/s; ``status`` shows the slot's health (``--json`` for machines; exit
code 2 when it is critical, lost or missing); ``pause`` / ``resume`` stop and restart a
capture's streaming without losing its place; ``recover`` brings back a capture whose slot was
invalidated. The commands are added to the ``lakefold capture`` group.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lakefold.cli._capture import (
    DsnOption,
    JsonOption,
    PublicationOption,
    SlotOption,
    StoreOption,
    _configured_store_dsn,
    _source_dsn,
    _store_dsn,
    capture_app,
    publication_scope,
    resolve_slot,
)
from lakefold.cli._common import SnapshotProgress, print_table
from lakefold.core.exceptions import ConfigurationError

_out = Console()


def _config(dsn: str | None, store_dsn: str | None, slot: str | None, publication: str,
            tables: list[str], stream_prefix: str = "", *, schema: str | None = None) -> Any:
    from lakefold.capture import CaptureConfig

    source = _source_dsn(dsn)
    store = store_dsn or _configured_store_dsn()
    return CaptureConfig(source_dsn=source, store_dsn=store,
                         slot=resolve_slot(slot, source, store), publication=publication,
                         schema=schema,
                         tables=() if schema else tuple(tables or ["public.unused"]),
                         stream_prefix=stream_prefix)


def _settings_source_dsn() -> str | None:
    from lakefold.settings import load_settings

    return load_settings().source_dsn()


@capture_app.command("resnapshot")
def resnapshot_command(
    table: Annotated[list[str], typer.Argument(help="Table(s) to re-read (schema.table).")],
    dsn: DsnOption = None,
    store_dsn: StoreOption = None,
    slot: SlotOption = None,
    publication: PublicationOption = "lakefold",
    chunk_rows: Annotated[int, typer.Option(
        help="Rows per chunk (each chunk's rows are share-locked while it is read).")] = 2_000,
    as_json: JsonOption = False,
) -> None:
    """Re-read tables into their streams while the capture keeps streaming (no pause)."""
    from dataclasses import replace

    from lakefold.capture import SnapshotPolicy, resnapshot

    if chunk_rows < 1:
        raise ConfigurationError(f"--chunk-rows must be at least 1, not {chunk_rows}")
    config = _config(dsn, store_dsn, slot, publication, table)
    config = replace(config, snapshot=SnapshotPolicy(incremental_chunk_rows=chunk_rows))
    with SnapshotProgress(enabled=not as_json) as progress:
        stats = resnapshot(config, table, listener=progress)
    result = {"snapshot_id": stats.snapshot_id, "tables": stats.tables, "rows": stats.rows,
              "chunks": stats.chunks, "seconds": round(stats.elapsed_s, 3),
              "rows_per_s": round(stats.rows_per_s, 1)}
    if as_json:
        typer.echo(json.dumps(result))
        return
    _out.print(f"re-snapshot {stats.snapshot_id}: {stats.rows:,} rows of {stats.tables} "
               f"table(s) in {stats.chunks:,} chunks, {stats.rows_per_s:,.0f} rows/s; the "
               "capture stores them as it reaches them in the stream")


@capture_app.command("status")
def status_command(
    dsn: DsnOption = None,
    store_dsn: StoreOption = None,
    slot: SlotOption = None,
    warn_lag_mb: Annotated[float, typer.Option(help="Warn above this lag (MiB).")] = 1024,
    critical_lag_mb: Annotated[float, typer.Option(help="Critical above (MiB).")] = 8192,
    warn_lag_seconds: Annotated[float, typer.Option(help="Warn above this lag (s).")] = 300,
    critical_lag_seconds: Annotated[float, typer.Option(help="Critical above (s).")] = 3600,
    warn_safe_wal_mb: Annotated[float, typer.Option(
        help="Warn when safe_wal_size falls below this (MiB).")] = 4096,
    critical_safe_wal_mb: Annotated[float, typer.Option(
        help="Critical when safe_wal_size falls below this (MiB).")] = 1024,
    as_json: JsonOption = False,
) -> None:
    """Health of a capture's slot: confirmed LSN, lag in bytes and seconds, wal_status,
    safe_wal_size, active or paused, last error. Exit code 2 when critical, lost or missing."""
    from lakefold.capture import HealthThresholds, slot_health

    mib = 1 << 20
    thresholds = HealthThresholds(
        lag_bytes=(int(warn_lag_mb * mib), int(critical_lag_mb * mib)),
        lag_seconds=(warn_lag_seconds, critical_lag_seconds),
        safe_wal_bytes=(int(warn_safe_wal_mb * mib), int(critical_safe_wal_mb * mib)))
    config = _config(dsn, store_dsn, slot, "lakefold", [])
    health = slot_health(config, thresholds=thresholds)
    if as_json:
        typer.echo(json.dumps(health.as_dict()))
    else:
        _print_health(health)
    if health.status in ("critical", "lost", "missing"):
        raise typer.Exit(2)


def _print_health(health: Any) -> None:
    colour = {"ok": "green", "warning": "yellow"}.get(health.status, "red")
    data = health.as_dict()
    if not health.exists:  # nothing to tabulate: say so, and why
        _out.print(f"slot {escape(health.slot)}: [{colour}]{health.status}[/]")
        for problem in health.problems:
            _out.print(f"[{colour}]•[/] {escape(problem)}", soft_wrap=True)
        return
    table = Table(title=f"slot {escape(health.slot)}: [{colour}]{health.status}[/]")
    table.add_column("field")
    table.add_column("value")
    rows = [
        ("active", "yes" if health.active else "no"),
        ("paused", "yes" if health.paused else "no"),
        ("wal_status", health.wal_status or "-"),
        ("confirmed LSN", data["confirmed_lsn_text"] or "-"),
        ("lag", "-" if health.lag_bytes is None else f"{health.lag_bytes:,} bytes"),
        ("lag (seconds)", "-" if health.lag_seconds is None else f"{health.lag_seconds:,.1f}"),
        ("retained WAL", "-" if health.retained_bytes is None
         else f"{health.retained_bytes:,} bytes"),
        ("safe_wal_size", "unlimited" if health.safe_wal_size is None
         else f"{health.safe_wal_size:,} bytes"),
        ("running capture", health.running_capture or "-"),
        ("records stored", f"{health.records:,}"),
        ("last heartbeat", str(health.last_heartbeat_at or "-")),
        ("last error", str(health.last_error or "-")),
    ]
    for name, value in rows:
        table.add_row(name, escape(value))
    print_table(_out, table)
    for problem in health.problems:
        _out.print(f"[{colour}]•[/] {escape(problem)}", soft_wrap=True)


@capture_app.command("pause")
def pause_command(store_dsn: StoreOption = None, slot: SlotOption = None) -> None:
    """Pause a capture: it stops streaming within a second; the slot keeps its place."""
    from lakefold.capture import pause_capture

    store = _store_dsn(store_dsn)
    slot = resolve_slot(slot, _settings_source_dsn(), store)
    pause_capture(store, slot)
    _out.print(f"paused capture {escape(slot)} (the server keeps its WAL until resume)")


@capture_app.command("resume")
def resume_command(store_dsn: StoreOption = None, slot: SlotOption = None) -> None:
    """Resume a paused capture where its slot stopped."""
    from lakefold.capture import resume_capture

    store = _store_dsn(store_dsn)
    slot = resolve_slot(slot, _settings_source_dsn(), store)
    resume_capture(store, slot)
    _out.print(f"resumed capture {escape(slot)}")


@capture_app.command("recover")
def recover_command(
    dsn: DsnOption = None,
    store_dsn: StoreOption = None,
    slot: SlotOption = None,
    publication: PublicationOption = "lakefold",
    schema: Annotated[str | None, typer.Option(
        help="Capture every table of this schema (default: what the publication covers).",
        show_default=False)] = None,
    table: Annotated[list[str] | None, typer.Option(
        "--table", help="Capture this table (default: what the publication covers).",
        show_default=False)] = None,
    stream_prefix: Annotated[str, typer.Option(help="Prefix of the stream names.")] = "",
) -> None:
    """Recover a capture whose slot was invalidated or lost: new slot, a truncate record in
    each stream, and a fresh initial snapshot (then run `lakefold capture run` again)."""
    from lakefold.capture import recover

    source = _source_dsn(dsn)
    if schema is None and not table:
        schema, table = publication_scope(source, publication)
    config = _config(source, store_dsn, slot, publication, list(table or []), stream_prefix,
                     schema=schema)
    with SnapshotProgress() as progress:
        recover(config, listener=progress)
    _out.print(f"recovered capture {escape(config.slot)}: new slot, streams truncated and "
               "re-snapshotted; start it again with `lakefold capture run`")
