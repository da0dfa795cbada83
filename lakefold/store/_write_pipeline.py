"""The store side of the capture pipeline: a thread that writes batches while the replication
reader keeps decoding.

The reader hands batches over through a small bounded queue (backpressure: when the store is
slower than the source, the reader waits and the server keeps the rest in its WAL, so memory
stays bounded). After each batch commits, ``durable_flush`` advances to the batch's flush LSN
and a byte is written to ``wakeup_fd`` so the reader, waiting in ``select``, can confirm it to
the slot at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
from typing import Any

import psycopg

from lakefold.core.dsn import mask_dsn
from lakefold.core.exceptions import LakefoldError
from lakefold.store._changelog_writer import Batch, ChangelogWriter
from lakefold.store.exceptions import ConnectionLostError, StoreError

log = logging.getLogger(__name__)

_TRANSIENT_CLASSES = ("08", "57P", "53", "40")


def translate_store_error(e: psycopg.Error, where: str, action: str) -> LakefoldError:
    """A psycopg error as a lakefold error: transient for lost connections, shutdowns,
    resource shortage and serialization failures, terminal otherwise. ``where`` names the
    server (with a masked DSN)."""
    state = e.sqlstate or ""
    if isinstance(e, psycopg.OperationalError) or state.startswith(_TRANSIENT_CLASSES):
        return ConnectionLostError(
            f"{where} failed while trying to {action}: {str(e).strip()}; the capture "
            "reconnects and resumes")
    return StoreError(f"{where} rejected {action}: {str(e).strip()} "
                      f"(SQLSTATE {state or 'none'})")


class StorePipeline:
    """A writer thread over its own store connection. ``submit`` blocks while two batches are
    already waiting; errors of the thread surface in the reader on its next call. ``owner``:
    the capture's ownership token, checked by every batch (see ``ChangelogWriter``)."""

    def __init__(self, conn: psycopg.Connection[Any], *, slot: str, dsn: str,
                 flushed: int, owner: str | None = None) -> None:
        self._writer = ChangelogWriter(conn, slot, owner=owner)
        self._conn = conn
        self._dsn = dsn
        self._queue: queue.Queue[Batch | None] = queue.Queue(maxsize=2)
        self._lock = threading.Lock()
        self._outstanding = 0
        self._idle = threading.Condition(self._lock)
        self.durable_flush = flushed
        self.records_written = 0
        self.batches_written = 0
        self._error: BaseException | None = None
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._thread = threading.Thread(target=self._run, name=f"lakefold-store-{slot}",
                                        daemon=True)
        self._thread.start()

    @property
    def wakeup_fd(self) -> int:
        return self._read_fd

    @property
    def idle(self) -> bool:
        """No batch waiting or being written."""
        return self._outstanding == 0

    def check(self) -> None:
        """Raise the writer thread's error, if it had one."""
        if self._error is not None:
            raise self._error

    def drain_wakeups(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read_fd, 4096):
                pass

    def submit(self, batch: Batch, *, while_waiting: Any = None) -> None:
        """Queue ``batch``; while the queue is full, call ``while_waiting()`` every 0.5 s (the
        reader sends keepalive feedback there)."""
        self.check()
        with self._lock:
            self._outstanding += 1
        while True:
            try:
                self._queue.put(batch, timeout=0.5)
                return
            except queue.Full:
                self.check()
                if while_waiting is not None:
                    while_waiting()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every submitted batch is written; False on timeout."""
        with self._idle:
            ok = self._idle.wait_for(lambda: self._outstanding == 0 or self._error is not None,
                                     timeout)
        self.check()
        return ok

    def close(self) -> None:
        """Stop the thread after the queued batches (or at once after an error) and close the
        store connection."""
        if self._thread.is_alive():
            if self._error is None:
                self._queue.put(None)
            else:
                with contextlib.suppress(queue.Empty):
                    while True:
                        self._queue.get_nowait()
                self._queue.put(None)
            self._thread.join(timeout=30)
        os.close(self._read_fd)
        os.close(self._write_fd)
        self._conn.close()

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            try:
                self._writer.write_batch(batch)
            except psycopg.Error as e:
                self._fail(translate_store_error(
                    e, f"the changelog store at {mask_dsn(self._dsn)}", "write a batch of records"))
                return
            except BaseException as e:  # surfaced in the reader thread by check()
                self._fail(e)
                return
            if batch.checkpoint is not None:
                self.durable_flush = max(self.durable_flush, batch.checkpoint.flush_lsn)
            self.records_written += batch.records
            self.batches_written += 1
            with self._idle:
                self._outstanding -= 1
                self._idle.notify_all()
            self._wake()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        with self._idle:
            self._idle.notify_all()
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self._write_fd, b"\x01")
