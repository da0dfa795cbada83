"""Slot health: where a capture's slot stands, how far behind it is, how close the server is
to invalidating it, and what to do when it was invalidated.

``slot_health(config)`` reads ``pg_replication_slots`` and the WAL position on the source and
the capture's records in the store: confirmed LSN, lag in bytes (WAL written after the
confirmed LSN) and in seconds, retained WAL (from the slot's restart LSN), ``wal_status``,
``safe_wal_size``, active or not, paused or not, the capture's last error and unfinished
snapshots. Thresholds (``HealthThresholds``) turn these into ``ok`` / ``warning`` /
``critical``; an invalidated slot is ``lost``, a slot that disappeared is ``missing``.

Lag in seconds: while a capture streams, the server's own ``flush_lag`` for its walsender
(``pg_stat_replication``); otherwise the age of the newest stored heartbeat at or before the
confirmed LSN (the source was at that LSN at that time, and nothing after it is captured).

An invalidated slot (the server removed WAL it still needed, because it retained more than
``max_slot_wal_keep_size``) means changes were lost. ``SlotInvalidatedError`` names the slot,
the cause and the one command that recovers: ``lakefold capture recover`` (``_recovery``),
which drops the slot, writes a truncate record into each of the capture's streams (so readers forget
rows whose deletes were lost) and captures again from a fresh initial snapshot.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import psycopg

from lakefold.capture._options import HealthThresholds
from lakefold.capture.decoding import _publishable
from lakefold.capture.exceptions import SlotError, StoreUnavailableError
from lakefold.capture.operations import _publication_guard
from lakefold.capture.operations._slot_ownership import current_owner
from lakefold.core.dsn import error_text, mask_dsn
from lakefold.core.exceptions import LakefoldError
from lakefold.core.wal import format_lsn, parse_lsn
from lakefold.store.internals import capture_state as state

if TYPE_CHECKING:
    from lakefold.capture._config import CaptureConfig


class SlotInvalidatedError(SlotError):
    """The replication slot was invalidated by the server; changes were lost."""


@dataclass(frozen=True, slots=True)
class SlotHealth:
    """The health of one capture's slot (see the module docstring). LSNs are ints; the
    ``*_text`` forms are in ``as_dict``."""

    slot: str
    status: str
    problems: tuple[str, ...]
    exists: bool
    active: bool
    active_pid: int | None
    paused: bool
    wal_status: str | None
    invalidation_reason: str | None
    confirmed_lsn: int | None
    restart_lsn: int | None
    current_lsn: int
    lag_bytes: int | None
    retained_bytes: int | None
    safe_wal_size: int | None
    lag_seconds: float | None
    inactive_since: datetime | None
    store_flush_lsn: int | None
    records: int
    last_heartbeat_at: datetime | None
    last_error: str | None
    last_error_at: datetime | None
    snapshots: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    # tables of the capture's scope left out of its publication ({"table", "reason", "fix"}),
    # published tables whose UPDATE and DELETE PostgreSQL refuses now, and whether the
    # publication guard (event trigger) watches the publication (None: scope unknown)
    tables_not_captured: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    tables_refused: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    publication_guard: bool | None = None
    # the capture running on the slot (``host h, pid p, since t``), None when none runs
    running_capture: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: datetimes in ISO form, LSNs also as ``X/Y`` text."""
        out = asdict(self)
        for name in ("confirmed_lsn", "restart_lsn", "current_lsn", "store_flush_lsn"):
            value = out[name]
            out[f"{name}_text"] = None if value is None else format_lsn(value)
        for name, value in list(out.items()):
            if isinstance(value, datetime):
                out[name] = value.isoformat()
        out["problems"] = list(self.problems)
        out["snapshots"] = [dict(s) for s in self.snapshots]
        out["tables_not_captured"] = [dict(t) for t in self.tables_not_captured]
        out["tables_refused"] = [dict(t) for t in self.tables_refused]
        return out


# invalidation_reason and inactive_since exist from PostgreSQL 17 on; read through to_jsonb so
# that the same query gives NULL for them on older servers.
_SLOT_QUERY = """
SELECT s.active, s.active_pid, s.wal_status, to_jsonb(s) ->> 'invalidation_reason',
       s.confirmed_flush_lsn::text, s.restart_lsn::text, s.safe_wal_size,
       (to_jsonb(s) ->> 'inactive_since')::timestamptz,
       pg_current_wal_lsn()::text,
       (SELECT extract(epoch FROM r.flush_lag) FROM pg_stat_replication r
        WHERE r.pid = s.active_pid)
FROM pg_replication_slots s WHERE s.slot_name = %s AND s.database = current_database()
"""
# A slot of that name for another database of the server (slot names are per server).
_ELSEWHERE_QUERY = """
SELECT database FROM pg_replication_slots WHERE slot_name = %s
AND database IS DISTINCT FROM current_database()
"""


def slot_health(config: CaptureConfig, *,
                thresholds: HealthThresholds | None = None) -> SlotHealth:
    """The health of ``config``'s slot; raises StoreUnavailableError when the source or the
    store cannot be reached."""
    thresholds = thresholds or HealthThresholds()
    try:
        with psycopg.connect(config.source_dsn, autocommit=True, connect_timeout=10) as src:
            row = src.execute(_SLOT_QUERY, (config.slot,)).fetchone()
            elsewhere = None
            if row is None:
                current = src.execute("SELECT pg_current_wal_lsn()::text").fetchone()
                current_lsn = parse_lsn(current[0]) if current else 0
                other = src.execute(_ELSEWHERE_QUERY, (config.slot,)).fetchone()
                elsewhere = None if other is None else str(other[0] or "no database")
    except psycopg.OperationalError as e:
        raise StoreUnavailableError(
            f"cannot reach the source at {mask_dsn(config.source_dsn)}: {error_text(e)}") from e
    store = _store_side(config)
    tables = _publication_side(config, store["scope"])
    problems: list[str] = []
    if row is None:
        if elsewhere is not None:
            problems.append(f"slot {config.slot!r} on this server belongs to database "
                            f"{elsewhere!r}, not to this one; pass --slot for this database's "
                            "capture")
        return _judge(SlotHealth(
            slot=config.slot, status="missing", problems=(), exists=False, active=False,
            active_pid=None, paused=store["paused"], wal_status=None, invalidation_reason=None,
            confirmed_lsn=None, restart_lsn=None, current_lsn=current_lsn, lag_bytes=None,
            retained_bytes=None, safe_wal_size=None, lag_seconds=None, inactive_since=None,
            store_flush_lsn=store["flush_lsn"], records=store["records"],
            last_heartbeat_at=store["heartbeat_at"], last_error=store["last_error"],
            last_error_at=store["last_error_at"], snapshots=store["snapshots"],
            running_capture=store["running_capture"], **tables),
            thresholds, problems, known=store["known"])
    (active, pid, wal_status, reason, confirmed, restart, safe, inactive_since, current,
     flush_lag) = row
    current_lsn = parse_lsn(current)
    confirmed_lsn = parse_lsn(confirmed) if confirmed else None
    restart_lsn = parse_lsn(restart) if restart else None
    lag_bytes = None if confirmed_lsn is None else max(current_lsn - confirmed_lsn, 0)
    lag_seconds: float | None
    if active and flush_lag is not None:
        lag_seconds = float(flush_lag)
    elif active and lag_bytes is not None and lag_bytes < 1 << 20:
        lag_seconds = 0.0  # streaming and caught up (the server reports no lag)
    else:
        beat = None
        if confirmed_lsn is not None:
            with psycopg.connect(config.resolved_store_dsn, autocommit=True,
                                 connect_timeout=10) as conn:
                beat = state.latest_heartbeat(conn, config.slot, at_or_before=confirmed_lsn)
        lag_seconds = None if beat is None else max(
            (datetime.now(UTC) - beat[1]).total_seconds(), 0.0)
    health = SlotHealth(
        slot=config.slot, status="ok", problems=(), exists=True, active=bool(active),
        active_pid=pid, paused=store["paused"], wal_status=wal_status,
        invalidation_reason=reason, confirmed_lsn=confirmed_lsn, restart_lsn=restart_lsn,
        current_lsn=current_lsn, lag_bytes=lag_bytes,
        retained_bytes=None if restart_lsn is None else max(current_lsn - restart_lsn, 0),
        safe_wal_size=None if safe is None else int(safe), lag_seconds=lag_seconds,
        inactive_since=inactive_since, store_flush_lsn=store["flush_lsn"],
        records=store["records"], last_heartbeat_at=store["heartbeat_at"],
        last_error=store["last_error"], last_error_at=store["last_error_at"],
        snapshots=store["snapshots"], running_capture=store["running_capture"], **tables)
    return _judge(health, thresholds, problems, known=store["known"])


def _publication_side(config: CaptureConfig,
                      scope: tuple[str, str | None, list[tuple[str, str]], bool] | None
                      ) -> dict[str, Any]:
    """The tables the capture leaves out of its publication and those PostgreSQL refuses
    UPDATE and DELETE on (see ``_publishable``), read from the source now."""
    publication = scope[0] if scope else config.publication
    try:
        with psycopg.connect(config.source_dsn, autocommit=True, connect_timeout=10) as src:
            excluded, refused, guarded = _publication_guard.report(
                src, publication, None if scope is None else _publishable.Scope(
                    scope[1], tuple(scope[2])))
    except psycopg.OperationalError as e:
        raise StoreUnavailableError(
            f"cannot reach the source at {mask_dsn(config.source_dsn)}: {error_text(e)}") from e
    return {"tables_not_captured": tuple(t.as_dict() for t in excluded),
            "tables_refused": tuple(t.as_dict() for t in refused),
            "publication_guard": guarded if scope is not None else None}


def _store_side(config: CaptureConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"paused": False, "flush_lsn": None, "records": 0,
                           "heartbeat_at": None, "last_error": None, "last_error_at": None,
                           "snapshots": (), "known": False, "scope": None,
                           "running_capture": None}
    try:
        with psycopg.connect(config.resolved_store_dsn, autocommit=True,
                             connect_timeout=10) as conn:
            if conn.execute("SELECT to_regclass('lakefold.capture_slots')").fetchone() == (None,):
                return out
            row = conn.execute("SELECT flush_lsn, records FROM lakefold.capture_slots "
                               "WHERE slot_name = %s", (config.slot,)).fetchone()
            if row is not None:
                out.update(flush_lsn=int(row[0]), records=int(row[1]), known=True)
            owner = current_owner(conn, config.slot)
            out["running_capture"] = None if owner is None else owner.describe()
            if not state.is_installed(conn):
                return out
            out["scope"] = state.scope(conn, config.slot)
            control = state.control(conn, config.slot)
            out.update(paused=control["paused"], last_error=control["last_error"],
                       last_error_at=control["last_error_at"])
            beat = state.latest_heartbeat(conn, config.slot)
            out["heartbeat_at"] = beat[1] if beat else None
            snapshots = []
            for run in state.runs(conn, config.slot, status="running"):
                tables = state.run_tables(conn, run.snapshot_id)
                snapshots.append({
                    "snapshot_id": run.snapshot_id, "kind": run.kind,
                    "tables_done": sum(t.status == "done" for t in tables),
                    "tables": len(tables), "rows": sum(t.rows for t in tables),
                    "last_error": run.last_error})
            out["snapshots"] = tuple(snapshots)
    except psycopg.OperationalError as e:
        raise StoreUnavailableError(
            f"cannot reach the store at {mask_dsn(config.resolved_store_dsn)}: "
            f"{str(e).strip()}") from e
    return out


def _judge(health: SlotHealth, thresholds: HealthThresholds, problems: list[str], *,
           known: bool) -> SlotHealth:
    levels = {"ok": 0, "warning": 1, "critical": 2}
    level = 0

    def flag(severity: str, text: str) -> None:
        nonlocal level
        level = max(level, levels[severity])
        problems.append(text)

    if not health.exists:
        if known:
            problems.append(f"slot {health.slot!r} is recorded in the store but missing on the "
                            f"source; recover with `lakefold capture recover --slot "
                            f"{health.slot}`")
        else:
            problems.append(f"no slot {health.slot!r}: the capture has not been set up")
        return _replace(health, "missing", problems)
    if health.wal_status == "lost" or health.invalidation_reason:
        problems.append(invalidated_message(health.slot, health.invalidation_reason))
        return _replace(health, "lost", problems)
    if health.wal_status == "unreserved":
        flag("critical", "the slot retains more WAL than max_slot_wal_keep_size; the next "
                         "checkpoint invalidates it unless the capture catches up")
    elif health.wal_status == "extended":
        flag("warning", "the slot retains more WAL than max_wal_size")
    for value, (warn, crit), what in (
            (health.lag_bytes, thresholds.lag_bytes, "bytes"),
            (health.lag_seconds, thresholds.lag_seconds, "seconds")):
        if value is not None and value >= crit:
            flag("critical", f"lag of {value:,.0f} {what} is above {crit:,}")
        elif value is not None and value >= warn:
            flag("warning", f"lag of {value:,.0f} {what} is above {warn:,}")
    if health.safe_wal_size is not None:
        warn, crit = thresholds.safe_wal_bytes
        if health.safe_wal_size <= crit:
            flag("critical", f"only {health.safe_wal_size:,} bytes of WAL before the server "
                             "invalidates the slot (safe_wal_size)")
        elif health.safe_wal_size <= warn:
            flag("warning", f"{health.safe_wal_size:,} bytes of WAL before the server "
                            "invalidates the slot (safe_wal_size)")
    for table in health.tables_refused:
        flag("critical", f"table {table['table']} is published but {table['reason']}: "
                         f"PostgreSQL refuses UPDATE and DELETE on it now. Fix: {table['fix']}; "
                         "or run the capture, which takes it out of the publication")
    for table in health.tables_not_captured:
        flag("warning", f"table {table['table']} is not captured: {table['reason']}. Fix: "
                        f"{table['fix']}; lakefold then captures it from a fresh snapshot")
    if health.publication_guard is False:
        flag("warning", "no publication guard (event trigger) on the source: the capture "
                        "role is not a superuser. If a captured table loses its primary key, "
                        "PostgreSQL refuses UPDATE and DELETE on it until the running capture "
                        "takes it out of the publication; run the capture once as a superuser "
                        "to install the guard")
    if health.paused:
        flag("warning", "the capture is paused; the slot keeps its place and retains WAL")
    elif not health.active:
        flag("warning", "no capture is streaming from the slot")
    if health.last_error:
        problems.append(f"last error: {health.last_error}")
    for run in health.snapshots:
        problems.append(f"{run['kind']} snapshot {run['snapshot_id']} unfinished: "
                        f"{run['tables_done']}/{run['tables']} tables")
    return _replace(health, ("ok", "warning", "critical")[level], problems)


def _replace(health: SlotHealth, status: str, problems: list[str]) -> SlotHealth:
    values = {f: getattr(health, f) for f in health.__dataclass_fields__}
    values.update(status=status, problems=tuple(problems))
    return SlotHealth(**values)


def invalidated_message(slot: str, reason: str | None) -> str:
    """What happened to an invalidated slot, and the one command that recovers."""
    cause = {
        "wal_removed": "the server removed WAL the slot still needed, because the slot "
                       "retained more than max_slot_wal_keep_size",
        "rows_removed": "the server removed catalog rows the slot still needed",
        "wal_level_insufficient": "wal_level was lowered below logical",
        "idle_timeout": "the slot was inactive longer than idle_replication_slot_timeout",
    }.get(reason or "wal_removed", f"the server invalidated it ({reason})")
    return (f"replication slot {slot!r} was invalidated: {cause}; the changes made since its "
            f"last confirmed position are lost. Recover with `lakefold capture recover --slot "
            f"{slot}`: it re-creates the slot and re-snapshots every table (each stream gets a "
            "truncate record first)")


def explain_failure(config: CaptureConfig, error: LakefoldError) -> LakefoldError:
    """``error`` as SlotInvalidatedError when the capture failed because its slot was
    invalidated; otherwise ``error`` itself."""
    if isinstance(error, SlotInvalidatedError):
        return error
    try:
        with psycopg.connect(config.source_dsn, autocommit=True, connect_timeout=5) as src:
            row = src.execute("SELECT wal_status, to_jsonb(s) ->> 'invalidation_reason' "
                              "FROM pg_replication_slots s WHERE slot_name = %s "
                              "AND database = current_database()", (config.slot,)).fetchone()
    except psycopg.Error:
        return error
    if row is not None and (row[0] == "lost" or row[1]):
        return SlotInvalidatedError(invalidated_message(config.slot, row[1]))
    return error
