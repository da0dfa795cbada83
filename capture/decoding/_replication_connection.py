"""A streaming-replication connection over psycopg's low-level ``pgconn`` (psycopg 3 has no
replication API): replication commands, COPY BOTH, standby status updates.

The connection is opened with ``replication=database`` and session settings that fix the text
form of every value pgoutput sends (ISO dates, ISO 8601 intervals, UTC, shortest exact floats,
hex bytea), and with an ``application_name`` that identifies the capture, so that a walsender
left behind by a killed run can be recognised and ended.

Reading is done by the capture loop itself (``pgconn.get_copy_data(1)`` plus ``select`` on the
socket, never sleeping); this module provides the pieces around it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import psycopg
from psycopg import pq, sql

from lakefold.capture.decoding._pgoutput import pg_now
from lakefold.capture.exceptions import (
    CaptureTerminalError,
    CaptureValueError,
    ConnectionLostError,
    SlotError,
    SourceConfigurationError,
)
from lakefold.core.dsn import mask_dsn
from lakefold.core.wal import format_lsn, parse_lsn

SESSION_OPTIONS: Final = (
    "-c datestyle=ISO,YMD -c intervalstyle=iso_8601 -c timezone=UTC "
    "-c extra_float_digits=1 -c bytea_output=hex"
)
_STATUS = struct.Struct(">cqqqqb")
_KEEPALIVE = struct.Struct(">qqb")


class SlotInUseError(ConnectionLostError):
    """The slot is still held by another walsender (often the one of a killed earlier run,
    which the server has not noticed yet); retried."""


@dataclass(frozen=True, slots=True)
class SystemIdentity:
    system_id: str
    timeline: int
    xlogpos: int
    database: str


@dataclass(frozen=True, slots=True)
class CreatedSlot:
    name: str
    consistent_point: int
    snapshot_name: str | None


def replication_conninfo(dsn: str, *, application_name: str) -> bytes:
    """``dsn`` with ``replication=database``, our session options and application name."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as e:
        raise SourceConfigurationError(f"the source DSN cannot be parsed: {e}") from e
    params["replication"] = "database"
    params["options"] = f"{params.get('options', '')} {SESSION_OPTIONS}".strip()
    params["application_name"] = application_name
    params.setdefault("connect_timeout", "10")
    return psycopg.conninfo.make_conninfo(**params).encode()  # type: ignore[arg-type]


def _sqlstate(result: pq.abc.PGresult) -> str:
    raw = result.error_field(pq.DiagnosticField.SQLSTATE)
    return raw.decode() if raw else ""


def raise_for_result(result: pq.abc.PGresult | None, action: str) -> None:
    """Raise the right lakefold error for a failed replication command result."""
    if result is None:
        raise ConnectionLostError(f"the replication connection closed while trying to {action}")
    if result.status not in (pq.ExecStatus.FATAL_ERROR, pq.ExecStatus.BAD_RESPONSE):
        return
    state = _sqlstate(result)
    message = result.get_error_message().strip()
    if state == "42704":
        raise SlotError(f"cannot {action}: {message}; the replication slot is gone, so the "
                        "capture must set it up again (run the capture again; it recreates it)")
    if state == "55006":
        raise SlotInUseError(f"cannot {action}: {message}")
    if state == "42501":
        raise SourceConfigurationError(
            f"cannot {action}: {message}; the role needs the REPLICATION attribute")
    if state.startswith(("08", "57P", "53")) or not state:
        raise ConnectionLostError(f"cannot {action}: {message}")
    raise CaptureTerminalError(f"cannot {action}: {message} (SQLSTATE {state})")


class ReplicationConnection:
    """One ``replication=database`` connection to the source."""

    def __init__(self, dsn: str, *, application_name: str) -> None:
        self._dsn = dsn
        self._conninfo = replication_conninfo(dsn, application_name=application_name)
        self._pgconn: pq.abc.PGconn | None = None

    @property
    def pgconn(self) -> pq.abc.PGconn:
        if self._pgconn is None:
            raise ConnectionLostError("the replication connection is not open")
        return self._pgconn

    def open(self) -> ReplicationConnection:
        """Connect; raises ConnectionLostError (transient) when the server cannot be reached."""
        conn = pq.PGconn.connect(self._conninfo)
        if conn.status != pq.ConnStatus.OK:
            message = conn.get_error_message().strip()
            conn.finish()
            raise ConnectionLostError(
                f"cannot open a replication connection to {mask_dsn(self._dsn)}: {message}")
        self._pgconn = conn
        return self

    def close(self) -> None:
        if self._pgconn is not None:
            self._pgconn.finish()
            self._pgconn = None

    def _command(self, command: bytes, action: str) -> pq.abc.PGresult:
        result = self.pgconn.exec_(command)
        raise_for_result(result, action)
        return result

    def identify_system(self) -> SystemIdentity:
        result = self._command(b"IDENTIFY_SYSTEM", "identify the source system")
        values = [result.get_value(0, i) for i in range(4)]
        return SystemIdentity(
            system_id=(values[0] or b"").decode(),
            timeline=int(values[1] or 0),
            xlogpos=parse_lsn((values[2] or b"0/0").decode()),
            database=(values[3] or b"").decode(),
        )

    def create_slot(self, name: str, *, snapshot: str = "nothing") -> CreatedSlot:
        """``CREATE_REPLICATION_SLOT name LOGICAL pgoutput (SNAPSHOT '...')``; ``snapshot`` is
        ``nothing``, ``export`` (the snapshot stays usable while this connection is idle) or
        ``use``."""
        if snapshot not in ("nothing", "export", "use"):
            raise CaptureValueError(f"snapshot must be nothing, export or use, not {snapshot!r}")
        command = sql.SQL("CREATE_REPLICATION_SLOT {} LOGICAL pgoutput (SNAPSHOT {})").format(
            sql.Identifier(name), sql.Literal(snapshot)).as_bytes(None)
        result = self._command(command, f"create replication slot {name!r}")
        point = (result.get_value(0, 1) or b"0/0").decode()
        snapshot_name = result.get_value(0, 2)
        return CreatedSlot(name, parse_lsn(point), snapshot_name.decode() if snapshot_name
                           else None)

    def start(self, slot: str, *, options: dict[str, str], start_lsn: int = 0) -> None:
        """``START_REPLICATION SLOT ... LOGICAL`` and enter COPY BOTH mode. ``start_lsn`` 0
        resumes from the slot's confirmed flush LSN."""
        rendered = sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(key), sql.Literal(value))
            for key, value in options.items())
        command = sql.SQL("START_REPLICATION SLOT {} LOGICAL {} ({})").format(
            sql.Identifier(slot), sql.SQL(format_lsn(start_lsn)), rendered).as_bytes(None)
        conn = self.pgconn
        conn.send_query(command)
        result = conn.get_result()
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            raise_for_result(result, f"start replication from slot {slot!r}")
            raise CaptureTerminalError(
                f"START_REPLICATION on slot {slot!r} did not enter COPY BOTH mode")
        conn.nonblocking = 1

    def send_status(self, *, written: int, flushed: int, reply: bool = False) -> None:
        """A standby status update: ``flushed`` is confirmed durable (the slot may advance)."""
        conn = self.pgconn
        message = _STATUS.pack(b"r", written, flushed, flushed, pg_now(), 1 if reply else 0)
        if conn.put_copy_data(message) != 1 or conn.flush() < 0:
            raise ConnectionLostError(
                f"cannot send feedback to the source: {conn.get_error_message().strip()}")


def parse_keepalive(data: memoryview | bytes) -> tuple[int, bool]:
    """(server WAL end, reply requested) of a primary keepalive message (``'k'``)."""
    wal_end, _clock, reply = _KEEPALIVE.unpack_from(data, 1)
    return wal_end, bool(reply)
