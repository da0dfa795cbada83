"""The monitor: one background thread that reads the overview every ``refresh_s`` and keeps
the latest, so that any number of clients polling the API or following its event stream cost
the stores one reading per interval, not one per request.

It fills in the rates (changes/s per capture, events/s of the event store) from the previous
reading, writes a history sample every ``sample_s`` (``_history``), and, when the store cannot
be read, keeps the error instead (the API answers 503 and the page shows a banner); it keeps
trying every interval, so the console recovers by itself when the store is back.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from lakefold.console._history import (
    install_console_tables,
    sample_time,
    samples_of,
    write_samples,
)
from lakefold.console._overview import StoreAddresses, read_overview
from lakefold.core.dsn import error_text
from lakefold.core.exceptions import LakefoldError
from lakefold.projections import DeadLetters
from lakefold.projections.operations import Catalog

log = logging.getLogger("lakefold.console")


def install_store(catalog: Catalog) -> None:
    """The tables the console reads and writes: the projection catalog and dead letters (as
    ``lakefold status`` installs them), the history samples and the audit."""
    catalog.install()
    DeadLetters(catalog).install()
    install_console_tables(catalog.dsn)


@dataclass(frozen=True)
class Reading:
    """The latest reading: the overview (and its JSON, made once for every client that asks
    before the next reading), or why there is none (the store is down)."""

    overview: dict[str, Any] | None
    error: str | None
    version: int
    seconds: float
    body: bytes = b""


class Monitor:
    """Reads the overview in the background; thread-safe."""

    def __init__(self, catalog: Catalog, addresses: StoreAddresses, *,
                 refresh_s: float = 1.0, sample_s: float = 10.0,
                 keep: dt.timedelta = dt.timedelta(hours=24)) -> None:
        self.catalog = catalog
        self.addresses = addresses
        self.refresh_s = refresh_s
        self.sample_s = sample_s
        self.keep = keep
        self._reading = Reading(None, "not read yet", 0, 0.0)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous: tuple[float, dict[str, Any]] | None = None
        self._last_sample = 0.0
        self._installed = False

    @property
    def reading(self) -> Reading:
        return self._reading

    def start(self) -> None:
        self.refresh()
        self._thread = threading.Thread(target=self._loop, name="lakefold-console-monitor",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.catalog.close()

    def refresh_soon(self) -> None:
        """Read again now (after an action), not at the next interval."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.refresh_s)
            self._wake.clear()
            if not self._stop.is_set():
                self.refresh()

    def refresh(self) -> None:
        """One reading; a failure is kept as the reading's error, never raised."""
        started = time.monotonic()
        try:
            if not self._installed:
                install_store(self.catalog)
                self._installed = True
            overview = read_overview(self.catalog, self.addresses)
        except (LakefoldError, psycopg.Error, OSError) as e:
            text = error_text(e) if isinstance(e, psycopg.Error) else str(e)
            if self._reading.error is None:
                log.warning("console: the store cannot be read (%s); retrying every %.0f s",
                            text, self.refresh_s)
            self._reading = Reading(None, text, self._reading.version + 1,
                                    time.monotonic() - started)
            return
        now = time.monotonic()
        self._fill_rates(now, overview)
        self._previous = (now, overview)
        if self._reading.error is not None and self._reading.version:
            log.warning("console: the store can be read again")
        self._reading = Reading(overview, None, self._reading.version + 1, now - started,
                                json.dumps(overview).encode())
        if now - self._last_sample >= self.sample_s:
            self._last_sample = now
            try:
                write_samples(self.addresses.store_dsn,
                              sample_time(dt.datetime.now(dt.UTC), self.sample_s),
                              samples_of(overview), keep=self.keep)
            except psycopg.Error as e:
                log.warning("console: could not store a history sample (%s)", error_text(e))

    def _fill_rates(self, now: float, overview: dict[str, Any]) -> None:
        if self._previous is None:
            return
        then, before = self._previous
        elapsed = max(now - then, 1e-3)
        records = {c["slot"]: c["records"] for c in before["captures"]}
        for capture in overview["captures"]:
            if capture["slot"] in records:
                delta = capture["records"] - records[capture["slot"]]
                capture["changes_per_s"] = round(max(0, delta) / elapsed, 1)
        delta = overview["event_store"]["head"] - before["event_store"]["head"]
        overview["event_store"]["events_per_s"] = round(max(0, delta) / elapsed, 1)
