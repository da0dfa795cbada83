"""A running capture's side thread: heartbeats, pause and resume, unfinished snapshots, and the
last error.

Heartbeats
    Every ``HeartbeatPolicy.interval`` the thread writes ``pg_logical_emit_message(false,
    'lakefold.heartbeat', ...)`` on the source. The capture receives it in stream order and
    confirms its LSN when nothing is open before it (``_inband_messages``), so the slot's confirmed
    LSN, and with it the WAL the server must keep, advances even while no captured table
    changes and other tables or databases write a lot.

Pause and resume
    ``pause(store, slot)`` sets a flag in ``lakefold.capture_control`` and notifies. A
    running capture notices within a second: it stores and confirms what it has received,
    closes its replication connection (the slot keeps its place; the server keeps the WAL
    from there) and waits until ``resume``; a capture started while paused waits likewise.

Rows to read again
    Rows queued in ``lakefold.capture_rereads`` (an update whose unchanged TOASTed value could
    not be filled) are read again in-band every second (``_reread``).

Unfinished snapshots
    Snapshot runs left unfinished by a crash (an initial snapshot interrupted after its slot
    was created, or an incremental one whose process died) are finished in the background
    while the capture streams (``_incremental_snapshot.resume``); so are the runs planned for tables
    that join the publication (``_inband_messages``), which wake the thread with a notification.

The publication
    Every ``_RECONCILE_S`` the thread makes the publication equal the publishable tables of
    the capture's scope (``_publishable.reconcile``). With the publication guard
    (``_publication_guard``) this only repairs what the guard could not do at once (a table it
    could not add while another transaction held the publication); without it (a capture role that
    is not a superuser) it takes a table whose key was dropped out of the publication within
    seconds, which ends PostgreSQL's refusal of its UPDATE and DELETE.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from lakefold.capture.decoding import _publishable
from lakefold.capture.decoding._inband_messages import HEARTBEAT_PREFIX, encode_heartbeat
from lakefold.capture.snapshots._initial_snapshot import (
    SnapshotListener,
    source_connection,
    utc_now,
)
from lakefold.capture.snapshots._reread import reread_rows
from lakefold.core.exceptions import LakefoldError, TransientError
from lakefold.store.internals import capture_state as state

if TYPE_CHECKING:
    from lakefold.capture._config import CaptureConfig

log = logging.getLogger(__name__)

_TICK_S = 0.2  # how often the side thread looks at stop, notifications, heartbeat timing
_CHECK_S = 1.0  # how often it reads the pause flag without a notification
_RECONCILE_S = 5.0  # how often it brings the publication in line with the capture's scope


def pause(store_dsn: str, slot: str) -> None:
    """Pause the capture of ``slot``: a running capture stops streaming within a second and
    the slot keeps its place until ``resume``."""
    with psycopg.connect(store_dsn, autocommit=True, connect_timeout=10) as conn:
        state.install(conn)
        state.set_paused(conn, slot, True)


def resume(store_dsn: str, slot: str) -> None:
    """Resume a paused capture of ``slot`` (it continues where the slot stopped)."""
    with psycopg.connect(store_dsn, autocommit=True, connect_timeout=10) as conn:
        state.install(conn)
        state.set_paused(conn, slot, False)


class CaptureControl:
    """The side thread of one ``Capture.run`` (see the module docstring)."""

    def __init__(self, config: CaptureConfig, stop: threading.Event, *,
                 listener: SnapshotListener | None = None) -> None:
        self.config = config
        self._stop = stop
        self._listener = listener
        self._paused = threading.Event()
        self._session_stops: list[threading.Event] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lakefold-control-{config.slot}",
                                        daemon=True)
        self._snapshots: threading.Thread | None = None
        self.heartbeats = 0
        self.last_heartbeat_lsn: int | None = None

    # -- the capture's side ----------------------------------------------------------------

    def start(self) -> CaptureControl:
        try:
            with psycopg.connect(self.config.resolved_store_dsn, autocommit=True,
                                 connect_timeout=10) as conn:
                if state.is_installed(conn) and state.is_paused(conn, self.config.slot):
                    self._paused.set()
        except psycopg.Error as e:  # the thread keeps trying; the capture reports the store
            log.warning("capture %s: cannot read the pause flag yet: %s", self.config.slot, e)
        self._thread.start()
        return self

    @property
    def paused(self) -> bool:
        return self._paused.is_set()

    def wait_while_paused(self) -> bool:
        """Block while the capture is paused; True when ``stop`` was set meanwhile."""
        announced = False
        while self._paused.is_set() and not self._stop.is_set():
            if not announced:
                log.info("capture %s is paused; waiting for resume", self.config.slot)
                announced = True
            self._stop.wait(_TICK_S)
        return self._stop.is_set()

    def session_stop(self) -> threading.Event:
        """An event that is set when the capture is stopped or paused (ends one session)."""
        event = threading.Event()
        with self._lock:
            self._session_stops = [e for e in self._session_stops if not e.is_set()]
            self._session_stops.append(event)
        if self._stop.is_set() or self._paused.is_set():
            event.set()
        return event

    def record_error(self, error: BaseException | None) -> None:
        """Keep the capture's last error in the store (shown by ``capture status``)."""
        text = None if error is None else f"{type(error).__name__}: {error}"
        try:
            with psycopg.connect(self.config.resolved_store_dsn, autocommit=True,
                                 connect_timeout=5) as conn:
                state.record_error(conn, self.config.slot, text)
        except psycopg.Error as e:
            log.warning("could not record the capture's error in the store: %s", e)

    def close(self) -> None:
        """Stop the thread; an unfinished snapshot run stops after its current chunk."""
        self._closed.set()
        self._thread.join(timeout=10)
        if self._snapshots is not None:
            self._snapshots.join(timeout=60)

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        policy = self.config.heartbeat
        next_beat = time.monotonic() + (policy.interval.total_seconds() if policy else 0)
        source: psycopg.Connection[Any] | None = None
        store: psycopg.Connection[Any] | None = None
        next_check = 0.0
        next_reconcile = time.monotonic() + _RECONCILE_S
        try:
            while not self._closed.wait(_TICK_S):
                if self._stop.is_set():
                    self._end_sessions()
                try:
                    store = store or self._listen()
                    notified = any(True for _ in store.notifies(timeout=0, stop_after=1))
                    checking = notified or time.monotonic() >= next_check
                    if checking:
                        next_check = time.monotonic() + _CHECK_S
                        self._check_paused(store)
                    if not self._paused.is_set():
                        self._start_snapshots(store, checking)
                    if time.monotonic() >= next_reconcile:
                        next_reconcile = time.monotonic() + _RECONCILE_S
                        source = source or source_connection(self.config.source_dsn,
                                                             autocommit=True)
                        self._reconcile(source)
                    if checking and not self._paused.is_set():
                        source = source or source_connection(self.config.source_dsn,
                                                             autocommit=True)
                        reread_rows(source, store, self.config)
                    if policy is not None and time.monotonic() >= next_beat \
                            and not self._paused.is_set():
                        next_beat = time.monotonic() + policy.interval.total_seconds()
                        source = source or source_connection(self.config.source_dsn,
                                                             autocommit=True)
                        self._beat(source)
                except (psycopg.Error, LakefoldError) as e:
                    log.warning("capture %s side thread: %s; retrying", self.config.slot, e)
                    for conn in (source, store):
                        if conn is not None:
                            conn.close()
                    source = store = None
                    self._closed.wait(1.0)
        finally:
            for conn in (source, store):
                if conn is not None:
                    conn.close()

    def _listen(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self.config.resolved_store_dsn, autocommit=True,
                               connect_timeout=10)
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(state.CONTROL_CHANNEL)))
        return conn

    def _check_paused(self, store: psycopg.Connection[Any]) -> None:
        if state.is_paused(store, self.config.slot):
            if not self._paused.is_set():
                log.info("capture %s: pause requested", self.config.slot)
                self._paused.set()
            self._end_sessions()
        elif self._paused.is_set():
            log.info("capture %s: resumed", self.config.slot)
            self._paused.clear()

    def _end_sessions(self) -> None:
        with self._lock:
            for event in self._session_stops:
                event.set()

    def _beat(self, source: psycopg.Connection[Any]) -> None:
        row = source.execute(
            "SELECT pg_logical_emit_message(false, %s, %s)::text",
            (HEARTBEAT_PREFIX, encode_heartbeat(self.config.slot, utc_now()))).fetchone()
        self.heartbeats += 1
        if row is not None:
            from lakefold.core.wal import parse_lsn

            self.last_heartbeat_lsn = parse_lsn(row[0])

    def _reconcile(self, source: psycopg.Connection[Any]) -> None:
        cfg = self.config
        scope = _publishable.Scope(cfg.schema, tuple((t.schema, t.table)
                                                     for t in cfg.table_refs))
        try:
            _publishable.reconcile(source, cfg.publication, scope, lock_timeout_ms=2_000,
                                   report_excluded=False)
        except psycopg.errors.LockNotAvailable:
            pass  # another transaction is changing the publication: next time
        except psycopg.errors.InsufficientPrivilege as e:
            log.warning("capture %s cannot bring publication %r in line with its tables: %s",
                        cfg.slot, cfg.publication, e.diag.message_primary)

    def _start_snapshots(self, store: psycopg.Connection[Any], checking: bool) -> None:
        """Start the thread that finishes unfinished snapshot runs: once at the start, and
        again (when it has ended) for incremental runs planned since."""
        if self._snapshots is not None:
            if self._snapshots.is_alive() or not checking or not any(
                    r.kind == "incremental"
                    for r in state.runs(store, self.config.slot, status="running")):
                return
        self._snapshots = threading.Thread(target=self._finish_snapshots, daemon=True,
                                           name=f"lakefold-snapshot-{self.config.slot}")
        self._snapshots.start()

    def _finish_snapshots(self) -> None:
        from lakefold.capture.snapshots._incremental_snapshot import resume

        delay = 1.0
        while not self._closed.is_set() and not self._stop.is_set():
            try:
                resume(self.config, listener=self._listener, kinds=("incremental",),
                       stop=self._closed)
                return
            except (TransientError, psycopg.OperationalError) as e:
                log.warning("finishing snapshots of %s: %s; retrying in %.0f s",
                            self.config.slot, e, delay)
            except (psycopg.Error, LakefoldError) as e:
                log.error("finishing snapshots of %s failed: %s", self.config.slot, e)
                self.record_error(e)
                return
            self._closed.wait(delay)
            delay = min(delay * 2, 30.0)
