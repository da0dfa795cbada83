"""``Capture``: set up the publication and slot, then stream changes into the changelog store,
reconnecting after connection drops, until stopped or caught up.

The guarantees:

* A source transaction becomes visible in the store atomically (stream heads move at commit).
* The slot's flush LSN is confirmed only after the records up to it are committed in the store
  (``StorePipeline.durable_flush``), so the server keeps every change not yet stored.
* After a crash or a reconnect, the server resends from the slot's confirmed LSN and the
  decoder skips what the store's checkpoint covers: a SIGKILL at any instant loses nothing and
  duplicates nothing.
* Set-up checks everything before it creates anything; a failure in set-up removes what that
  set-up created. A crash in the middle of creating the slot is recognised and repaired by
  the next set-up (``_slot_intent``).
* One live capture per slot and store (``_slot_ownership``): a second one refuses, naming the
  first, unless told to take over; the first then stops cleanly and never takes the slot back.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg

from lakefold.capture._config import CaptureConfig
from lakefold.capture.decoding._decoder import Decoder, DecoderOptions
from lakefold.capture.decoding._inband_messages import DecoderExtension
from lakefold.capture.decoding._replication_connection import (
    ReplicationConnection,
    SlotInUseError,
    parse_keepalive,
    raise_for_result,
)
from lakefold.capture.decoding._source_catalog import SourceCatalog
from lakefold.capture.exceptions import (
    CaptureError,
    CaptureTerminalError,
    ConnectionLostError,
    OwnershipError,
    OwnershipLostError,
    SlotError,
    StoreError,
)
from lakefold.capture.operations import (
    _publication_guard,
    _slot_health,
    _slot_intent,
    _slot_ownership,
    _source_setup,
    _sources,
)
from lakefold.capture.operations._control import CaptureControl
from lakefold.capture.snapshots import _incremental_snapshot, _initial_snapshot
from lakefold.capture.snapshots._initial_snapshot import SnapshotListener
from lakefold.capture.snapshots._reread import reread_queued
from lakefold.core.dsn import error_text, mask_dsn
from lakefold.core.exceptions import LakefoldError, TransientError
from lakefold.core.wal import format_lsn
from lakefold.store.internals import (
    ChangelogWriter,
    StorePipeline,
    capture_state,
    ddl,
    translate_store_error,
)

log = logging.getLogger(__name__)

_IDLE_PROBE_S = 0.05  # how often to ask the server where it is while waiting for until_lsn
_SYNC_AFTER_S = 0.5  # then nudge it with a WAL message (see _nudge)


@dataclass(frozen=True, slots=True)
class CaptureStats:
    """What one ``Capture.run`` did."""

    records: int
    batches: int
    flushed_lsn: int
    reconnects: int
    elapsed_s: float

    @property
    def flushed_lsn_text(self) -> str:
        return format_lsn(self.flushed_lsn)


@dataclass
class _Counters:
    records: int = 0
    batches: int = 0
    flushed: int = 0
    reconnects: int = 0


def _connect(dsn: str, *, what: str, setup: bool) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as e:
        reason = error_text(e)
        if setup:
            cls: type[CaptureError] = StoreError if what == "store" else CaptureError
            raise cls(
                f"cannot connect to the {what} at {mask_dsn(dsn)}: {reason}; check the "
                f"{'store DSN (LAKEFOLD_STORE_DSN)' if what == 'store' else 'DSN (LAKEFOLD_DSN)'}"
                " and that the server is running and reachable"
            ) from e
        raise ConnectionLostError(f"cannot connect to the {what} at {mask_dsn(dsn)}: "
                                  f"{reason}") from e


def _store_session(dsn: str, slot: str) -> psycopg.Connection[Any]:
    """A store connection that reads or writes the slot's records, named so that a later owner
    of the slot can end it (fencing, see ``_slot_ownership``)."""
    conn = _connect(dsn, what="store", setup=False)
    try:
        conn.execute("SELECT set_config('application_name', %s, false)",
                     (_slot_ownership.store_application_name(slot),))
    except psycopg.Error as e:
        conn.close()
        raise translate_store_error(e, f"the store ({mask_dsn(dsn)})", "name a session") from e
    return conn


def drop_capture(source_dsn: str, store_dsn: str, *, slot: str, publication: str) -> None:
    """Drop a capture's slot (ending a walsender of this capture that still holds it) and its
    publication if lakefold created it, and forget the slot in the store. Streams stay.
    Raises CaptureRunningError while a capture of the slot runs, SlotError when another
    program holds the slot."""
    with _slot_ownership.SlotOwnership.acquire(
            store_dsn, slot, refusal="Stop that capture first, then drop its slot"), \
            _connect(store_dsn, what="store", setup=True) as store, \
            _connect(source_dsn, what="source database", setup=True) as source:
        record = ChangelogWriter(store, slot).slot_record() if ddl.is_installed(store) else None
        if record is not None:  # never drop (nor forget) another source's capture
            system_id, database = _source_setup.system_identity(source)
            _sources.check_slot_source(slot, record, system_id=system_id, database=database,
                                       remedy="pass that source's DSN to drop it, or --slot "
                                              "of this source's capture")
        info = _source_setup.slot_info(source, slot)
        if info is not None:
            if _source_setup.terminate_stale_walsender(source, info, f"lakefold-capture:{slot}"):
                time.sleep(0.2)
            _source_setup.drop_slot(source, slot)
        exists, comment = _source_setup.publication_comment(source, publication)
        if exists and comment == _source_setup.PUBLICATION_MARKER:
            source.execute(psycopg.sql.SQL("DROP PUBLICATION {}").format(
                psycopg.sql.Identifier(publication)))
        _publication_guard.uninstall(source, publication)
        if capture_state.is_installed(store):
            capture_state.forget_scope(store, slot)
        if ddl.is_installed(store):
            ChangelogWriter(store, slot).forget_slot()
            _slot_intent.forget(store, slot)


class Capture:
    """Captures the configured tables of one source database into changelog streams.

    ``setup()`` validates the source and creates the publication and slot (``run`` calls it);
    ``run()`` streams changes; ``drop()`` removes the slot and publication (streams stay).
    """

    def __init__(self, config: CaptureConfig, *, listener: SnapshotListener | None = None) -> None:
        self.config = config
        self._database = ""
        self._system_id = ""
        self._source = ""  # host:port/database, as shown (_sources.source_label)
        self._listener = listener  # progress of snapshots (the CLI's progress bar)
        self._ownership: _slot_ownership.SlotOwnership | None = None  # held by setup() and run()

    # -- ownership -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _owned(self) -> Iterator[_slot_ownership.SlotOwnership]:
        """Own the slot for the block, or keep the ownership ``run`` already holds."""
        if self._ownership is not None:
            yield self._ownership
            return
        cfg = self.config
        ownership = _slot_ownership.SlotOwnership.acquire(
            cfg.resolved_store_dsn, cfg.slot, take_over=cfg.take_over,
            take_over_timeout=cfg.take_over_timeout.total_seconds())
        self._ownership = ownership
        try:
            yield ownership
        finally:
            self._ownership = None
            ownership.release()

    def _owner(self) -> _slot_ownership.SlotOwnership:
        if self._ownership is None:
            raise CaptureTerminalError(
                "the capture does not own its slot here; call setup() or run()")
        return self._ownership

    # -- set-up ----------------------------------------------------------------------------

    def setup(self) -> None:
        """Check the source and the store, then create what is missing: store tables,
        publication, slot. Idempotent. Nothing is left half-made when it fails. Owns the slot
        meanwhile: raises CaptureRunningError while another capture runs on it."""
        with self._owned():
            self._setup()

    def _setup(self) -> None:
        cfg = self.config
        store_dsn = cfg.resolved_store_dsn
        with _connect(store_dsn, what="store", setup=True) as store, \
                _connect(cfg.source_dsn, what="source database", setup=True) as source:
            _source_setup.check_source(source)
            existing = _source_setup.slot_info(source, cfg.slot)
            _source_setup.resolve_tables(source, schema=cfg.schema, tables=cfg.table_refs,
                                         require_keys=existing is None)
            guard = _source_setup.check_guard(source, schema=cfg.schema)
            self._system_id, self._database = _source_setup.system_identity(source)
            self._source = _sources.source_label(source)
            writer = ChangelogWriter(store, cfg.slot)
            record = writer.slot_record() if ddl.is_installed(store) else None
            intent = _slot_intent.load(store, cfg.slot) if record is None else None
            if intent is None:
                self._check_ownership(existing, record)
            else:  # an earlier set-up was interrupted while creating the slot
                _slot_intent.check(intent, system_id=self._system_id, database=self._database,
                                   source=source)
            had_publication, comment = _source_setup.publication_comment(source, cfg.publication)
            if had_publication and comment != _source_setup.PUBLICATION_MARKER:
                raise OwnershipError(
                    f"publication {cfg.publication!r} already exists and was not created by "
                    "lakefold; lakefold only captures through a publication it owns. Choose "
                    "another publication name, or drop that publication if it is unused")
            ddl.install(store)
            if record is None:  # a new slot: checked and registered under the prefix lock
                _sources.claim_prefix(store)  # (released once registered, or with `store`)
            # A prefix of another source's capture would mix two tables in one stream.
            _sources.check_prefix(store, slot=cfg.slot, prefix=cfg.stream_prefix,
                                  system_id=self._system_id, database=self._database)
            capture_state.install(store)
            self._owner().record()
            if record is not None:
                _sources.record_source(store, slot=cfg.slot, prefix=cfg.stream_prefix,
                                       label=self._source)
            if intent is not None:
                _slot_intent.discard_orphan(source, store, intent,
                                            application_name=cfg.application_name)
                existing = None
            _source_setup.ensure_publication(source, cfg.publication, schema=cfg.schema,
                                             tables=cfg.table_refs, guard=guard)
            capture_state.record_scope(store, cfg.slot, cfg.publication, cfg.schema,
                                        [(t.schema, t.table) for t in cfg.table_refs],
                                        guarded=guard)
            if existing is None:
                try:
                    self._create_slot(source, writer, drop_publication=not had_publication)
                except BaseException:
                    if not had_publication:  # what this set-up created goes again
                        _publication_guard.uninstall(source, cfg.publication)
                        capture_state.forget_scope(store, cfg.slot)
                    raise

    def _check_ownership(self, slot: _source_setup.SlotInfo | None,
                         record: dict[str, Any] | None) -> None:
        cfg = self.config
        if record is not None:  # first: a slot of another server is not "lost" on this one
            _sources.check_slot_source(cfg.slot, record, system_id=self._system_id,
                                       database=self._database)
        if slot is not None and record is None:
            raise OwnershipError(
                f"replication slot {cfg.slot!r} already exists on the source but this store has "
                "no record of it: it belongs to another program or another lakefold store. "
                "Choose another slot name, or drop the slot if it is unused")
        if slot is None and record is not None:
            raise SlotError(
                f"replication slot {cfg.slot!r} is recorded in the store but no longer exists on "
                "the source (dropped or lost), so changes since "
                f"{format_lsn(int(record['flush_lsn']))} may be missing. Run `lakefold capture "
                "drop` for this slot and capture again from a fresh snapshot")
        if slot is None or record is None:
            return
        _source_setup.check_slot(slot, database=self._database,
                                 application_name=cfg.application_name)
        if record["publication"] != cfg.publication:
            raise OwnershipError(
                f"slot {cfg.slot!r} captures publication {record['publication']!r}, not "
                f"{cfg.publication!r}; use the same publication, or another slot name")

    def _create_slot(self, source: psycopg.Connection[Any], writer: ChangelogWriter, *,
                     drop_publication: bool) -> None:
        cfg = self.config
        store = writer.connection
        repl = ReplicationConnection(cfg.source_dsn, application_name=cfg.application_name)
        created = None
        snapshot_id = None
        try:
            # The intent first: a crash from here until the slot is registered leaves an
            # intent the next set-up recognises (_slot_intent), never an unknown slot.
            _slot_intent.record(store, slot=cfg.slot, system_id=self._system_id,
                                database=self._database, source=source)
            repl.open()
            # With an initial snapshot the connection stays open (and idle) until the rows are
            # copied: that keeps the exported snapshot alive (see _initial_snapshot).
            created = repl.create_slot(cfg.slot,
                                       snapshot="export" if cfg.snapshot.initial else "nothing")
            if created.snapshot_name:
                snapshot_id = _initial_snapshot.plan_initial(writer.connection, source, cfg,
                                                             consistent_lsn=created.consistent_point)
            else:
                repl.close()
            with store.transaction():
                writer.register_slot(publication=cfg.publication, system_id=self._system_id,
                                     database=self._database,
                                     consistent_point=created.consistent_point,
                                     source=self._source, stream_prefix=cfg.stream_prefix)
                _slot_intent.forget(store, cfg.slot)
            _sources.release_prefix(store)  # registered: the next set-up sees the prefix
            log.info("created slot %s at %s", cfg.slot, format_lsn(created.consistent_point))
        except BaseException:
            repl.close()
            if created is not None:
                _source_setup.drop_slot(source, cfg.slot)
            with contextlib.suppress(psycopg.Error):  # else the next set-up forgets it
                _slot_intent.forget(store, cfg.slot)
            if drop_publication:
                source.execute(psycopg.sql.SQL("DROP PUBLICATION IF EXISTS {}").format(
                    psycopg.sql.Identifier(cfg.publication)))
            raise
        if snapshot_id is not None and created is not None and created.snapshot_name:
            try:  # a failure here leaves the run unfinished: Capture.run resumes it
                _initial_snapshot.copy_exported(cfg, snapshot_id, created.snapshot_name,
                                                database=self._database, listener=self._listener)
            finally:
                repl.close()

    def drop(self) -> None:
        """Drop the slot and the publication (if lakefold owns them) and forget the slot in
        the store. Streams and their records stay."""
        cfg = self.config
        drop_capture(cfg.source_dsn, cfg.resolved_store_dsn, slot=cfg.slot,
                     publication=cfg.publication)

    # -- running ---------------------------------------------------------------------------

    def run(self, *, stop: threading.Event | None = None, until_lsn: int | None = None,
            on_started: Callable[[], None] | None = None) -> CaptureStats:
        """Capture until ``stop`` is set, or until everything up to ``until_lsn`` is durable in
        the store. For "everything committed so far" pass the source's
        ``pg_current_wal_insert_lsn()`` (``pg_current_wal_lsn()`` lags behind commits made
        with ``synchronous_commit = off``). ``on_started`` is called once the set-up (checks,
        publication, slot, initial snapshot) has succeeded, before streaming begins.

        Connection drops are retried with exponential backoff (up to
        ``config.max_backoff``); terminal errors raise.

        The run owns the slot (``_slot_ownership``): CaptureRunningError when another capture runs
        on it (unless ``config.take_over``). When another capture takes the slot over, this
        run stops cleanly, sets ``stop`` and raises OwnershipLostError.
        """
        stop = stop or threading.Event()
        with self._owned() as ownership:
            ownership.watch(stop.set)  # a take-over request or a lost lock ends the run
            try:
                stats = self._run(stop, until_lsn, on_started)
            except LakefoldError as e:
                if ownership.lost is None or isinstance(e, OwnershipLostError):
                    raise
                raise OwnershipLostError(ownership.lost) from e
        if ownership.lost is not None:
            raise OwnershipLostError(ownership.lost)
        return stats

    def _run(self, stop: threading.Event, until_lsn: int | None,
             on_started: Callable[[], None] | None) -> CaptureStats:
        started = time.monotonic()
        try:
            self.setup()
        except SlotError as e:  # an invalidated slot: say so, and how to recover
            explained = _slot_health.explain_failure(self.config, e)
            if explained is e:
                raise
            raise explained from e
        counters = _Counters()
        control = CaptureControl(self.config, stop, listener=self._listener).start()
        compactor = self._start_compactor(stop)
        if on_started is not None:
            on_started()
        backoff = 0.1
        failures = 0
        initial_pending = True
        try:
            while True:
                before = counters.records
                try:
                    if control.wait_while_paused():
                        break
                    if initial_pending:  # an initial snapshot interrupted by a crash
                        _incremental_snapshot.resume(self.config, listener=self._listener,
                                                     kinds=("initial",))
                        reread_queued(self.config)  # rows queued by an earlier run
                        initial_pending = False
                    self._session(control.session_stop(), until_lsn, counters)
                    if control.paused and not stop.is_set() and not (
                            until_lsn is not None and counters.flushed >= until_lsn):
                        continue  # paused: the slot keeps its place until resumed
                    break
                except TransientError as e:
                    control.record_error(e)
                    if stop.is_set():
                        break
                    failures = 0 if counters.records > before else failures + 1
                    if self.config.max_retries is not None and failures > \
                            self.config.max_retries:
                        raise
                    counters.reconnects += 1
                    backoff = 0.1 if counters.records > before else backoff
                    log.warning("capture %s: %s; reconnecting in %.1f s", self.config.slot, e,
                                backoff)
                    stop.wait(backoff)
                    backoff = min(backoff * 2, self.config.max_backoff.total_seconds())
        except LakefoldError as e:
            explained = _slot_health.explain_failure(self.config, e)
            if not isinstance(e, OwnershipLostError):  # the slot is fine: another capture has it
                control.record_error(explained)
            if explained is e:
                raise
            raise explained from e
        finally:
            control.close()
            if compactor is not None:
                compactor.stop()
        return CaptureStats(counters.records, counters.batches, counters.flushed,
                            counters.reconnects, time.monotonic() - started)

    def _start_compactor(self, stop: threading.Event) -> Any:
        if self.config.compaction is None:
            return None
        from lakefold.store.internals import BackgroundCompactor

        return BackgroundCompactor(self.config.resolved_store_dsn, self.config.compaction,
                                   slot=self.config.slot).start()

    def _session(self, stop: threading.Event, until_lsn: int | None,
                 counters: _Counters) -> None:
        cfg = self.config
        store_dsn = cfg.resolved_store_dsn
        ownership = self._owner()
        meta = _store_session(store_dsn, cfg.slot)
        pipeline: StorePipeline | None = None
        repl = ReplicationConnection(cfg.source_dsn, application_name=cfg.application_name)
        side: psycopg.Connection[Any] | None = None
        try:
            ownership.check()  # before reading the slot's state: only its owner may
            side = _connect(cfg.source_dsn, what="source database", setup=False)
            registry = ChangelogWriter(meta, cfg.slot)
            state = registry.load_state()
            decoder = Decoder(
                state,
                resolver=SourceCatalog(side, database=self._database),
                registry=registry,
                options=DecoderOptions(database=self._database, stream_prefix=cfg.stream_prefix,
                                       keep_messages=cfg.keep_messages,
                                       batch_rows=cfg.batch_rows, batch_bytes=cfg.batch_bytes,
                                       slot=cfg.slot, publication=cfg.publication),
                hooks=DecoderExtension(cfg.slot, publication=cfg.publication,
                                       stream_prefix=cfg.stream_prefix),
            )
            self._claim_slot(side)
            repl.open()
            repl.start(cfg.slot, options=self._plugin_options())
            pipeline = StorePipeline(_store_session(store_dsn, cfg.slot),
                                     slot=cfg.slot, dsn=store_dsn,
                                     flushed=state.checkpoint.flush_lsn, owner=ownership.token)
            _Loop(self, repl, decoder, pipeline, side, stop, until_lsn, counters).run()
            repl.close()
            _wait_released(side, cfg.slot)
        except psycopg.Error as e:
            raise translate_store_error(
                e, f"the source ({mask_dsn(cfg.source_dsn)}) or the store", "keep capturing") from e
        finally:
            if pipeline is not None:
                counters.records += pipeline.records_written
                counters.batches += pipeline.batches_written
                pipeline.close()
            repl.close()
            meta.close()
            if side is not None:
                side.close()

    def _claim_slot(self, side: psycopg.Connection[Any]) -> None:
        """The slot must exist; a walsender of an earlier, killed run is ended."""
        slot = _source_setup.slot_info(side, self.config.slot)
        if slot is None:
            raise SlotError(f"replication slot {self.config.slot!r} disappeared from the source; "
                            "run `lakefold capture drop` and capture again from a snapshot")
        _source_setup.check_slot(slot, database=self._database,
                                 application_name=self.config.application_name)
        self._owner().check()  # only the slot's owner may end a walsender of its name
        if _source_setup.terminate_stale_walsender(side, slot, self.config.application_name):
            raise SlotInUseError(f"slot {self.config.slot!r} was still held by the walsender "
                                 f"of an earlier run (pid {slot.active_pid}); ended it")

    def _plugin_options(self) -> dict[str, str]:
        cfg = self.config
        options = {
            "proto_version": "2" if cfg.streaming else "1",
            "publication_names": psycopg.sql.Identifier(cfg.publication).as_string(),
        }
        if cfg.streaming:
            options["streaming"] = "on"
        # Always: snapshot chunks and heartbeats arrive as logical decoding messages
        # (_inband_messages).
        options["messages"] = "true"
        return options


def _wait_released(side: psycopg.Connection[Any], slot: str, timeout: float = 5.0) -> None:
    """Wait until the server's walsender has let go of ``slot`` (it notices the closed
    connection on its own), so that the slot is free for the next run when ``run`` returns."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = side.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                           (slot,)).fetchone()
        if row is None or not row[0]:
            return
        time.sleep(0.01)
    log.warning("slot %s is still held by its walsender %.0f s after the capture closed its "
                "connection", slot, timeout)


class _Loop:
    """One replication session's read loop (kept apart from Capture for readability)."""

    def __init__(self, capture: Capture, repl: ReplicationConnection, decoder: Decoder,
                 pipeline: StorePipeline, side: psycopg.Connection[Any], stop: threading.Event,
                 until_lsn: int | None, counters: _Counters) -> None:
        self.capture = capture
        self.repl = repl
        self.decoder = decoder
        self.pipeline = pipeline
        self.side = side
        self.stop = stop
        self.until_lsn = until_lsn
        self.counters = counters
        self.sent_flush = pipeline.durable_flush
        self.idle_flush = 0  # LSN confirmed from keepalives while nothing was pending
        self.received = 0
        self.last_status = time.monotonic()
        self.idle_since: float | None = None
        self.last_probe = 0.0
        self.nudged = False
        self.feedback_every = capture.config.feedback_interval.total_seconds()

    @property
    def confirmed(self) -> int:
        return max(self.pipeline.durable_flush, self.idle_flush)

    def _quiet(self) -> bool:
        return not self.decoder.in_transaction and not self.decoder.has_pending \
            and self.pipeline.idle

    def send_status(self, *, reply: bool = False, force: bool = False) -> None:
        confirmed = self.confirmed
        now = time.monotonic()
        if confirmed > self.sent_flush or reply or force \
                or now - self.last_status >= self.feedback_every:
            self.repl.send_status(written=max(self.received, confirmed), flushed=confirmed,
                                  reply=reply)
            self.sent_flush = max(self.sent_flush, confirmed)
            self.last_status = now
            self.counters.flushed = max(self.counters.flushed, confirmed)

    def submit(self) -> None:
        self.pipeline.submit(self.decoder.take_batch(), while_waiting=self.send_status)
        self.send_status()

    def done(self) -> bool:
        return self.until_lsn is not None and self.confirmed >= self.until_lsn

    def run(self) -> None:
        pgconn = self.repl.pgconn
        get_copy_data = pgconn.get_copy_data
        decoder = self.decoder
        feed = decoder.feed
        selector = selectors.DefaultSelector()
        selector.register(pgconn.socket, selectors.EVENT_READ)
        selector.register(self.pipeline.wakeup_fd, selectors.EVENT_READ)
        try:
            while True:
                nbytes, data = get_copy_data(1)
                if nbytes > 0:
                    kind = data[0]
                    if kind == 0x77:  # 'w' XLogData
                        feed(bytes(data))
                        if decoder.batch_full:
                            self.submit()
                            if self.stop.is_set():
                                break
                    elif kind == 0x6B:  # 'k' keepalive
                        wal_end, reply = parse_keepalive(data)
                        self.received = max(self.received, wal_end)
                        if self._quiet() and wal_end > self.idle_flush:
                            self.idle_flush = wal_end
                        if reply:
                            self.send_status(force=True)
                    continue
                if nbytes == 0:
                    if self._idle_step():
                        break
                    ready = selector.select(timeout=self._wait_timeout())
                    if any(key.fd == self.pipeline.wakeup_fd for key, _ in ready):
                        self.pipeline.drain_wakeups()
                        self.pipeline.check()
                    pgconn.consume_input()
                    continue
                if nbytes == -1:
                    raise_for_result(pgconn.get_result(), "keep replicating")
                    raise ConnectionLostError("the source ended the replication stream")
                raise ConnectionLostError(
                    f"replication connection failed: {pgconn.get_error_message().strip()}")
            self._finish()
        except psycopg.OperationalError as e:
            raise ConnectionLostError(f"the replication connection to the source dropped: "
                                      f"{str(e).strip()}") from e
        finally:
            selector.close()

    def _wait_timeout(self) -> float:
        if self.until_lsn is not None and self._quiet():
            return _IDLE_PROBE_S
        return 1.0

    def _idle_step(self) -> bool:
        """Work to do whenever the socket has nothing buffered; True to end the session."""
        decoder = self.decoder
        if decoder.has_pending and (not decoder.in_transaction or decoder.batch_full):
            self.submit()
        self.pipeline.check()
        self.send_status()
        if self.stop.is_set() or self.done():
            return True
        if self.until_lsn is not None and self._quiet():
            now = time.monotonic()
            self.idle_since = self.idle_since or now
            if now - self.last_probe >= _IDLE_PROBE_S:
                self.last_probe = now
                self.send_status(reply=True)  # the server answers with where it is
            if not self.nudged and now - self.idle_since >= _SYNC_AFTER_S:
                self._nudge()
        else:
            self.idle_since = None
        return False

    def _nudge(self) -> None:
        """Write a tiny non-transactional WAL message, so that the walsender's position
        passes ``until_lsn`` even when nothing else is written after it."""
        self.nudged = True
        try:
            self.side.execute("SELECT pg_logical_emit_message(false, 'lakefold.sync', '')")
        except psycopg.Error as e:
            log.warning("could not write a sync message to the source (%s); waiting for the "
                        "server to move on its own", e)

    def _finish(self) -> None:
        """Store what is pending, wait for the store, confirm the final flush LSN."""
        if self.decoder.has_pending:
            self.pipeline.submit(self.decoder.take_batch(), while_waiting=self.send_status)
        while not self.pipeline.wait_idle(timeout=0.5):
            self.send_status()
        self.send_status(force=True)
