"""Slot ownership: at most one live capture per slot in a store, and a clean hand-over.

The owner
    A capture holds a session-level advisory lock, keyed by its slot name, on a store
    connection of its own for as long as it runs (``SlotOwnership``). The lock needs no
    heartbeat and dies with its session: when the owner's process is killed, its host closes
    the connection and the server ends the session at once, so the next capture starts
    without waiting (the dead run's walsender, which may linger, is then ended by the new
    owner: only an owner may end it). A host that vanishes without closing its connections is
    detected by TCP keepalives that the lock session turns on (about 25 s). The row in
    ``lakefold.capture_owners`` says who owns the slot (host, pid, since when) for messages.

A second capture
    refuses to start and names the owner, unless it was told to take over
    (``CaptureConfig.take_over``, ``lakefold capture run --take-over``). A lock that is held
    for a moment by a session whose process just died is waited for (``GRACE_S``).

Take-over
    The newcomer writes a request into the owner's row and waits. The owner notices within
    ``POLL_S``, stops its capture cleanly (what it received is stored and confirmed), closes
    its connections and only then gives up the lock, raising ``OwnershipLostError``; the
    newcomer then gets the lock. An owner that does not stop within
    ``CaptureConfig.take_over_timeout`` is not forced: the newcomer fails, naming it.

Losing the lock
    When the lock session itself drops (a store restart, a network cut), the owner connects
    again and takes the lock back only if it is free, nobody owned the slot meanwhile and no
    take-over was asked for; otherwise it has lost the slot: it stops and never takes the slot
    back by itself, so two captures never take turns.

Fencing
    A former owner that stalled (a frozen process, a network partition) must not write after
    the new owner read the slot's state. Every batch the capture writes checks, in its own
    transaction, that the owner row still carries its token (``ChangelogWriter``), and a new
    owner, after writing its token, ends the store sessions of earlier owners (application name
    ``lakefold-store:<slot>``) and waits until they are gone: a batch that read the old token
    either committed before the new owner reads the slot's state, or is rolled back.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import psycopg

from lakefold.capture.exceptions import (
    CaptureRunningError,
    ConnectionLostError,
    OwnershipLostError,
    StoreError,
)
from lakefold.core.dsn import error_text, mask_dsn
from lakefold.store.internals import ddl

log = logging.getLogger(__name__)

POLL_S: Final = 0.25  # how often an owner looks for take-over requests and checks its lock
GRACE_S: Final = 2.0  # how long a held lock is waited for before refusing to start
_RETRY_S: Final = 0.05
_REQUEST_EVERY_S: Final = 1.0  # a waiting take-over renews its request this often
_KEEPALIVES: Final = "keepalives=1 keepalives_idle=10 keepalives_interval=5 keepalives_count=3"
_MAX_NAME: Final = 63  # application_name is cut at NAMEDATALEN - 1 bytes
_START_HINT: Final = ("Stop that one first, or start this one with --take-over (CaptureConfig("
                      "take_over=True)) to make it stop cleanly and hand the slot over")


def lock_key(slot: str) -> int:
    """The advisory lock key (a signed 64-bit int) of ``slot`` in a store."""
    digest = hashlib.blake2b(f"lakefold.capture-slot:{slot}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def store_application_name(slot: str) -> str:
    """The application name of the capture's store sessions that write the slot's records
    (a new owner ends earlier owners' sessions by it)."""
    return f"lakefold-store:{slot}"[:_MAX_NAME]


def _owner_application_name(slot: str) -> str:
    return f"lakefold-owner:{slot}"[:_MAX_NAME]


@dataclass(frozen=True, slots=True)
class Owner:
    """Who holds a slot's lock: from its owner row, or only its store session."""

    session_pid: int
    host: str | None = None
    pid: int | None = None
    since: datetime | None = None
    client: str | None = None

    def describe(self) -> str:
        """``host h, pid p, since t`` (or the store session when the row is not written)."""
        since = f"{self.since:%Y-%m-%d %H:%M:%S %Z}".strip() if self.since else "an unknown time"
        if self.host is not None:
            return f"host {self.host}, pid {self.pid}, since {since}"
        return (f"store session {self.session_pid} from {self.client or 'a local socket'}, "
                f"since {since}")


class SlotOwnership:
    """The ownership of one slot in one store, held until ``release`` (see the module
    docstring). Use ``acquire``; the methods are thread-safe."""

    def __init__(self, conn: psycopg.Connection[Any], store_dsn: str, slot: str) -> None:
        self._conn: psycopg.Connection[Any] | None = conn
        self._dsn = store_dsn
        self.slot = slot
        self.token = uuid.uuid4().hex
        self._key = lock_key(slot)
        self._lock = threading.Lock()
        self._recorded = False
        self._acquired_at: datetime | None = None
        self._lost: str | None = None
        self._closed = threading.Event()
        self._watcher: threading.Thread | None = None

    # -- taking the slot -------------------------------------------------------------------

    @classmethod
    def acquire(cls, store_dsn: str, slot: str, *, take_over: bool = False,
                take_over_timeout: float = 30.0, refusal: str = _START_HINT) -> SlotOwnership:
        """Own ``slot`` in the store at ``store_dsn``. Raises CaptureRunningError when another
        live capture owns it (with ``take_over``: when it did not hand over in time);
        ``refusal`` is what that error tells the user to do."""
        ownership = cls(_connect(store_dsn, slot), store_dsn, slot)
        try:
            ownership._take(take_over=take_over, timeout=take_over_timeout, refusal=refusal)
        except BaseException:
            ownership._close()
            raise
        return ownership

    def _take(self, *, take_over: bool, timeout: float, refusal: str) -> None:
        started = time.monotonic()
        asked: tuple[int, float] | None = None  # (owner session asked, when)
        while not self._try_lock():
            owner = self._holder()
            if owner is None:  # released just now: try again
                time.sleep(_RETRY_S)
                continue
            waited = time.monotonic() - started
            if not take_over:
                if waited >= GRACE_S:
                    raise CaptureRunningError(
                        f"slot {self.slot!r} is being captured by another lakefold capture "
                        f"({owner.describe()}); a slot has one capture at a time. {refusal}")
            elif waited >= timeout:
                self._withdraw_take_over()  # a stalled owner must not obey it later
                raise CaptureRunningError(
                    f"the capture of slot {self.slot!r} ({owner.describe()}) was asked to hand "
                    f"the slot over but did not stop within {timeout:.0f} s; it may be stuck. "
                    "Stop that process (or kill it) and start this capture again")
            elif asked is None or asked[0] != owner.session_pid \
                    or time.monotonic() - asked[1] >= _REQUEST_EVERY_S:
                if asked is None:
                    log.warning("slot %s is captured by %s; asking it to hand the slot over",
                                self.slot, owner.describe())
                self._request_take_over()
                asked = (owner.session_pid, time.monotonic())
            time.sleep(_RETRY_S)

    def _try_lock(self) -> bool:
        row = self._connection().execute("SELECT pg_try_advisory_lock(%s), now()",
                                         (self._key,)).fetchone()
        if row is None or not row[0]:
            return False
        self._acquired_at = self._acquired_at or row[1]
        return True

    def _holder(self) -> Owner | None:
        """The owner holding the slot's lock now, or None when it is free."""
        return current_owner(self._connection(), self.slot)

    def _request_take_over(self) -> None:
        conn = self._connection()
        if not _owners_table(conn):
            ddl.install(conn)
        conn.execute(
            "INSERT INTO lakefold.capture_owners (slot_name, takeover_host, takeover_pid, "
            "takeover_at) VALUES (%s, %s, %s, now()) ON CONFLICT (slot_name) DO UPDATE SET "
            "takeover_host = EXCLUDED.takeover_host, takeover_pid = EXCLUDED.takeover_pid, "
            "takeover_at = EXCLUDED.takeover_at",
            (self.slot, socket.gethostname(), os.getpid()))

    def _withdraw_take_over(self) -> None:
        self._connection().execute(
            "UPDATE lakefold.capture_owners SET takeover_host = NULL, takeover_pid = NULL, "
            "takeover_at = NULL WHERE slot_name = %s AND takeover_host = %s "
            "AND takeover_pid = %s", (self.slot, socket.gethostname(), os.getpid()))

    def record(self) -> None:
        """Write this capture into the owner row (the store's tables must be installed), then
        end the store sessions of earlier owners and wait until they are gone (fencing, see
        the module docstring). Idempotent."""
        with self._lock:
            if self._recorded:
                return
            conn = self._connection()
            conn.execute(
                "INSERT INTO lakefold.capture_owners (slot_name, token, host, pid, session_pid, "
                "started_at) VALUES (%s, %s, %s, %s, pg_backend_pid(), %s) "
                "ON CONFLICT (slot_name) DO UPDATE SET token = EXCLUDED.token, "
                "host = EXCLUDED.host, pid = EXCLUDED.pid, session_pid = EXCLUDED.session_pid, "
                "started_at = EXCLUDED.started_at, takeover_host = NULL, takeover_pid = NULL, "
                "takeover_at = NULL",
                (self.slot, self.token, socket.gethostname(), os.getpid(), self._acquired_at))
            self._recorded = True
            self._end_earlier_sessions(conn)

    def _end_earlier_sessions(self, conn: psycopg.Connection[Any]) -> None:
        name = store_application_name(self.slot)
        try:
            rows = conn.execute(
                "SELECT pid, pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = %s "
                "AND pid <> pg_backend_pid()", (name,)).fetchall()
        except psycopg.errors.InsufficientPrivilege as e:
            raise StoreError(
                f"an earlier capture of slot {self.slot!r} still has store sessions that this "
                f"role may not end ({e.diag.message_primary}); capture as the same role, or "
                "grant it pg_signal_backend") from e
        if not rows:
            return
        log.warning("slot %s: ended %d store session(s) of an earlier capture", self.slot,
                    len(rows))
        stuck = conn.execute("SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)",
                             ([r[0] for r in rows],)).fetchall()
        if stuck:
            raise StoreError(
                f"store session(s) {[r[0] for r in stuck]} of an earlier capture of slot "
                f"{self.slot!r} did not end within 10 s; end them (SELECT "
                "pg_terminate_backend(pid)) and start again")

    # -- while capturing -------------------------------------------------------------------

    def watch(self, on_lost: Callable[[], object]) -> None:
        """Check the ownership every ``POLL_S`` in a thread; call ``on_lost()`` once when the
        slot is lost or a take-over was asked for (``lost`` says why)."""
        def run() -> None:
            while not self._closed.wait(POLL_S):
                with self._lock:
                    self._verify()
                if self._lost is not None:
                    on_lost()
                    return

        self._watcher = threading.Thread(target=run, daemon=True,
                                         name=f"lakefold-owner-{self.slot}")
        self._watcher.start()

    @property
    def lost(self) -> str | None:
        """Why this capture lost its slot (None while it owns it)."""
        return self._lost

    def check(self) -> None:
        """Make sure this capture still owns the slot: raises OwnershipLostError when it does
        not, ConnectionLostError (transient) when the store cannot tell right now."""
        with self._lock:
            self._verify()
            if self._lost is not None:
                raise OwnershipLostError(self._lost)
            if self._conn is None:
                raise ConnectionLostError(
                    f"cannot reach the store at {mask_dsn(self._dsn)} to confirm that this "
                    f"capture still owns slot {self.slot!r}; retrying")

    def _verify(self) -> None:
        """Under ``_lock``: look at the owner row; after a dropped session, take the lock
        again if that is safe. Sets ``_lost``; leaves ``_conn`` None while unreachable."""
        if self._lost is not None or self._closed.is_set():
            return
        try:
            if self._conn is None or self._conn.closed:
                self._conn = None
                self._conn = _connect(self._dsn, self.slot)
                if not self._try_lock():
                    owner = self._holder()
                    self._lose(f"capture on {owner.describe()}" if owner else "another capture",
                               "took the slot while this capture's store session was cut")
                    return
            if not self._recorded:
                return
            row = self._conn.execute(
                "SELECT token, takeover_host, takeover_pid, takeover_at, takeover_at >= %s "
                "FROM lakefold.capture_owners WHERE slot_name = %s",
                (self._acquired_at, self.slot)).fetchone()
        except (psycopg.OperationalError, StoreError) as e:
            if self._conn is not None:  # said once per outage, not at every retry
                log.warning("slot %s: the ownership session to the store dropped (%s); "
                            "reconnecting", self.slot, str(e).strip())
            self._drop_connection()
            return
        if row is None or row[0] != self.token:
            self._lose("another capture", "owns it now")
        elif row[4]:
            self._lost = (
                f"slot {self.slot!r} was taken over by the capture on host {row[1]}, pid "
                f"{row[2]} (asked at {row[3]:%Y-%m-%d %H:%M:%S %Z} with --take-over); this "
                "capture stored and confirmed what it had received and stopped. It does not "
                "take the slot back by itself: start it again with --take-over if it should "
                "be the one capturing")
            log.warning("slot %s: the capture on host %s, pid %s asks for it (--take-over); "
                        "stopping cleanly", self.slot, row[1], row[2])

    def _lose(self, who: str, how: str) -> None:
        self._lost = (
            f"this capture lost slot {self.slot!r}: {who} {how}. It stopped and does not take "
            "the slot back by itself; start it again with --take-over if it should be the one "
            "capturing")
        log.warning("slot %s: %s %s; stopping", self.slot, who, how)

    # -- letting go ------------------------------------------------------------------------

    def release(self) -> None:
        """Stop watching, forget the owner row and give up the lock (closing its session)."""
        self._closed.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=10)
        with self._lock:
            if self._conn is not None and not self._conn.closed and self._recorded:
                try:
                    self._conn.execute("DELETE FROM lakefold.capture_owners "
                                       "WHERE slot_name = %s AND token = %s",
                                       (self.slot, self.token))
                except psycopg.Error as e:  # the lock goes with the session all the same
                    log.warning("slot %s: could not remove the owner row: %s", self.slot, e)
            self._close()

    def __enter__(self) -> SlotOwnership:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            raise ConnectionLostError(f"the ownership session of slot {self.slot!r} is closed")
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def _close(self) -> None:
        self._drop_connection()


def current_owner(conn: psycopg.Connection[Any], slot: str) -> Owner | None:
    """The capture holding ``slot``'s lock in the store ``conn`` is connected to, or None
    when no capture runs on it."""
    unsigned = lock_key(slot) & 0xFFFF_FFFF_FFFF_FFFF
    row = conn.execute(
        "SELECT l.pid, a.client_addr::text, a.backend_start FROM pg_locks l "
        "LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND l.classid = %s::bigint::oid AND l.objid = %s::bigint::oid",
        (unsigned >> 32, unsigned & 0xFFFF_FFFF)).fetchone()
    if row is None:
        return None
    session_pid, client, since = int(row[0]), row[1], row[2]
    if _owners_table(conn):
        owner = conn.execute(
            "SELECT host, pid, started_at FROM lakefold.capture_owners "
            "WHERE slot_name = %s AND session_pid = %s", (slot, session_pid)).fetchone()
        if owner is not None and owner[0] is not None:
            return Owner(session_pid, owner[0], owner[1], owner[2])
    return Owner(session_pid, since=since, client=client)


def _owners_table(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT to_regclass('lakefold.capture_owners') IS NOT NULL").fetchone()
    return bool(row and row[0])


def _connect(dsn: str, slot: str) -> psycopg.Connection[Any]:
    """The lock session: autocommit, named, with TCP keepalives on both ends."""
    try:
        conninfo = psycopg.conninfo.make_conninfo(dsn, application_name=_owner_application_name(
            slot), **psycopg.conninfo.conninfo_to_dict(_KEEPALIVES))
        conn = psycopg.connect(conninfo, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as e:
        reason = error_text(e)  # the cause (Connection refused) and libpq's hint
        raise StoreError(
            f"cannot connect to the store at {mask_dsn(dsn)}: {reason}; check the store DSN "
            "(LAKEFOLD_STORE_DSN) and that the server is running and reachable") from e
    # The server ends the session (and with it the lock) when the client's host is gone.
    conn.execute("SET tcp_keepalives_idle = 10")
    conn.execute("SET tcp_keepalives_interval = 5")
    conn.execute("SET tcp_keepalives_count = 3")
    return conn
