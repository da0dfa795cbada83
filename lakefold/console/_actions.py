"""Actions a person takes from the console, each written to the audit table
(``lakefold.console_audit``: who, what, on what, when, and how it ended).

Every action is the operation the CLI already has: pause and resume of a projection
(``Catalog.set_paused``, as ``lakefold pause``) or of a capture (``pause_capture``, as
``lakefold capture pause``), a rebuild (``request_rebuild``, as ``lakefold rebuild``; a
running ``lakefold run`` builds and switches), retry or drop of a dead letter (as ``lakefold
dlq``) and a re-snapshot of tables (``resnapshot``, as ``lakefold capture resnapshot``; it
runs in the background, its progress shows in the overview). Asking for what is already so
(pausing a paused projection) changes nothing and says so.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from lakefold.capture import CaptureConfig, pause_capture, resume_capture, slot_health
from lakefold.capture.snapshots import plan_resnapshot, run_locked
from lakefold.console.exceptions import ConsoleNotFoundError, ConsoleRequestError
from lakefold.core.exceptions import LakefoldError
from lakefold.projections import DeadLetters, Registry, load_projections
from lakefold.projections.operations import Catalog, request_rebuild

log = logging.getLogger("lakefold.console")


@dataclass(frozen=True)
class Outcome:
    """What an action did: ``changed`` False when it was already so; ``message`` says it."""

    action: str
    subject: str
    changed: bool
    message: str
    audit_id: int = 0
    detail: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"action": self.action, "subject": self.subject, "changed": self.changed,
                "message": self.message, "audit_id": self.audit_id, "detail": self.detail}


def write_audit(store_dsn: str, *, who: str, action: str, subject: str,
                detail: dict[str, Any], outcome: str) -> int:
    """One audit row; returns its id."""
    with psycopg.connect(store_dsn, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute(
            "INSERT INTO lakefold.console_audit (who, action, subject, detail, outcome) "
            "VALUES (%s, %s, %s, %s, %s) RETURNING id",
            (who, action, subject, Jsonb(detail), outcome)).fetchone()
    return int(row[0]) if row else 0


def read_audit(store_dsn: str, *, limit: int) -> list[dict[str, Any]]:
    """The latest audit rows, newest first."""
    with psycopg.connect(store_dsn, autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute(
            "SELECT id, at, who, action, subject, detail, outcome FROM lakefold.console_audit "
            "ORDER BY id DESC LIMIT %s", (limit,)).fetchall()
    return [{"id": r[0], "at": r[1].isoformat(), "who": r[2], "action": r[3],
             "subject": r[4], "detail": r[5], "outcome": r[6]} for r in rows]


class Actions:
    """The console's actions on one store (and the captures' source database)."""

    def __init__(self, catalog: Catalog, store_dsn: str, source_dsn: str | None, *,
                 projections: str | None = None) -> None:
        self.catalog = catalog
        self.store_dsn = store_dsn
        self.source_dsn = source_dsn or store_dsn
        self.projections = projections
        self._registry: Registry | None = None
        self._snapshots: list[threading.Thread] = []

    def _audited(self, who: str, outcome: Outcome) -> Outcome:
        audit_id = write_audit(self.store_dsn, who=who, action=outcome.action,
                               subject=outcome.subject, detail=outcome.detail,
                               outcome=outcome.message)
        return Outcome(outcome.action, outcome.subject, outcome.changed, outcome.message,
                       audit_id, outcome.detail)

    # ------------------------------------------------------------------ projections

    def set_paused(self, who: str, name: str, paused: bool) -> Outcome:
        """Pause or resume a projection (a view too); a no-op when it already is."""
        action = "pause" if paused else "resume"
        row = self.catalog.projection(name)  # ProjectionNotFoundError: 404
        if row.paused == paused:
            return self._audited(who, Outcome(
                action, name, False, f"projection {name} is already "
                f"{'paused' if paused else 'running (not paused)'}; nothing was changed"))
        self.catalog.set_paused(name, paused)
        if not paused and row.state == "failed":
            self.catalog.set_state(name, "idle", keep_error=True)
        return self._audited(who, Outcome(
            action, name, True, f"projection {name} {'paused' if paused else 'resumed'}"))

    def rebuild(self, who: str, name: str) -> Outcome:
        """Begin generation N+1 of a projection (and of the views that read a view); a running
        ``lakefold run`` builds it and switches."""
        self.catalog.projection(name)  # ProjectionNotFoundError: 404
        building = self.catalog.building(name)
        if building is not None:
            return self._audited(who, Outcome(
                "rebuild", name, False, f"projection {name} is already being rebuilt into "
                f"generation {building.generation}; nothing was changed",
                detail={"generation": building.generation}))
        generation = request_rebuild(self.catalog, self.store_dsn, self._loaded_registry(),
                                     name)
        return self._audited(who, Outcome(
            "rebuild", name, True, f"building generation {generation.generation} of {name}; "
            "a running `lakefold run` builds it and switches when it has caught up",
            detail={"generation": generation.generation}))

    def _loaded_registry(self) -> Registry:
        if self.projections is None:
            raise ConsoleRequestError(
                "a rebuild needs the projections' definitions: start the console with "
                "--projections FILE (or set LAKEFOLD_PROJECTIONS)")
        if self._registry is None:
            self._registry = load_projections(self.projections)
        return self._registry

    # ------------------------------------------------------------------ dead letters

    def dead_letter(self, who: str, letter_id: int, *, retry: bool) -> Outcome:
        """Retry (at the projection's next batch) or drop one open dead letter."""
        letters = DeadLetters(self.catalog)
        action = "retry" if retry else "drop"
        try:
            (letter,) = (letters.request_retry if retry else letters.drop)([letter_id])
        except LakefoldError as e:
            if "no dead letter with id" in str(e):
                raise ConsoleNotFoundError(f"no dead letter with id {letter_id}; "
                                           "GET /api/dead-letters lists them") from e
            raise
        return self._audited(who, Outcome(
            action, f"dead letter {letter_id}", True,
            f"dead letter {letter_id} of {letter.name} "
            f"{'queued for retry' if retry else 'dropped'}",
            detail={"projection": letter.name, "id": letter_id}))

    # ------------------------------------------------------------------ captures

    def _capture_config(self, slot: str, tables: tuple[str, ...] = ("public.unused",)
                        ) -> CaptureConfig:
        with psycopg.connect(self.store_dsn, autocommit=True, connect_timeout=10) as conn:
            try:
                row = conn.execute("SELECT publication FROM lakefold.capture_slots "
                                   "WHERE slot_name = %s", (slot,)).fetchone()
            except psycopg.errors.UndefinedTable:  # no capture ever ran against this store
                row = None
        if row is None:
            raise ConsoleNotFoundError(
                f"no capture with slot {slot!r} in the store; GET /api/overview lists them")
        return CaptureConfig(source_dsn=self.source_dsn, store_dsn=self.store_dsn, slot=slot,
                             publication=str(row[0]), tables=tables)

    def set_capture_paused(self, who: str, slot: str, paused: bool) -> Outcome:
        """Pause or resume a capture's streaming; a no-op when it already is."""
        action = "pause capture" if paused else "resume capture"
        health = slot_health(self._capture_config(slot))
        if health.paused == paused:
            return self._audited(who, Outcome(
                action, slot, False, f"capture {slot} is already "
                f"{'paused' if paused else 'streaming (not paused)'}; nothing was changed"))
        (pause_capture if paused else resume_capture)(self.store_dsn, slot)
        return self._audited(who, Outcome(
            action, slot, True, f"capture {slot} {'paused' if paused else 'resumed'}"))

    def resnapshot(self, who: str, slot: str, tables: list[str]) -> Outcome:
        """Re-read tables of a capture into their streams, in the background; its progress
        shows in the overview (the capture's running snapshots). A table the capture does not
        cover (or that does not exist) is refused here, before anything starts: the error
        is raised and the refusal audited."""
        if not tables:
            raise ConsoleRequestError("name at least one table to re-snapshot (schema.table)")
        config = self._capture_config(slot, tuple(tables))
        try:
            snapshot_id = plan_resnapshot(config, tables)
        except LakefoldError as e:
            self._audited(who, Outcome("resnapshot", slot, False, f"refused: {e}",
                                       detail={"tables": tables}))
            raise

        def run() -> None:
            try:
                stats = run_locked(config, snapshot_id)
                if stats is not None:
                    log.warning("console: re-snapshot of %s done: %d rows", ", ".join(tables),
                                stats.rows)
            except LakefoldError as e:
                log.error("console: re-snapshot of %s failed: %s", ", ".join(tables), e)

        thread = threading.Thread(target=run, name="lakefold-console-resnapshot", daemon=True)
        thread.start()
        self._snapshots.append(thread)
        return self._audited(who, Outcome(
            "resnapshot", slot, True, f"re-snapshot {snapshot_id} of {', '.join(tables)} "
            "started; its progress shows under the capture",
            detail={"tables": tables, "snapshot_id": snapshot_id}))
