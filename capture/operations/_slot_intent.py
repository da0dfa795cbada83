"""Recoverable slot creation: the store records its intent to create a slot before
``CREATE_REPLICATION_SLOT``, and forgets it in the transaction that registers the slot.

A capture killed between the two (the slot exists on the source, the store has no record of
it) used to be unable to start again, and the orphaned slot held WAL until someone dropped it.
Now the next set-up finds the intent and recognises the slot as its own when

* the intent names this source (system identifier and database) and the slot is a pgoutput
  slot of that database, and
* the slot's restart LSN is not older than the source's WAL insert position recorded before
  the creation (a slot made earlier, by anyone, is older);

it then drops that slot (ending the dead creator's walsender if it lingers) and creates it
again. The orphan's snapshot was never copied, and its exported snapshot died with the
creator: a slot that was never registered never gives the store data (its planned initial
snapshot is abandoned). A slot that is not recognised is refused, never dropped.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from lakefold.capture.exceptions import OwnershipError, SlotError
from lakefold.capture.operations import _source_setup
from lakefold.core.wal import parse_lsn

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SlotIntent:
    """A slot the store began to create: on which source, and the WAL position before."""

    slot: str
    system_id: str
    database: str
    wal_lsn: int


def record(store: psycopg.Connection[Any], *, slot: str, system_id: str, database: str,
           source: psycopg.Connection[Any]) -> SlotIntent:
    """Record (commit) the intent to create ``slot`` on ``source`` now."""
    row = source.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    intent = SlotIntent(slot, system_id, database, parse_lsn(row[0] if row else "0/0"))
    store.execute(
        "INSERT INTO lakefold.capture_slot_intents (slot_name, source_system_id, "
        "source_database, wal_lsn) VALUES (%s, %s, %s, %s) ON CONFLICT (slot_name) DO UPDATE "
        "SET source_system_id = EXCLUDED.source_system_id, source_database = "
        "EXCLUDED.source_database, wal_lsn = EXCLUDED.wal_lsn, created_at = now()",
        (slot, system_id, database, intent.wal_lsn))
    return intent


def load(store: psycopg.Connection[Any], slot: str) -> SlotIntent | None:
    """The unfinished creation of ``slot``, if the store has one."""
    if store.execute("SELECT to_regclass('lakefold.capture_slot_intents')").fetchone() \
            == (None,):
        return None
    row = store.execute(
        "SELECT source_system_id, source_database, wal_lsn FROM lakefold.capture_slot_intents "
        "WHERE slot_name = %s", (slot,)).fetchone()
    return None if row is None else SlotIntent(slot, row[0], row[1], int(row[2]))


def forget(store: psycopg.Connection[Any], slot: str) -> None:
    """Remove the intent (in the slot's registering transaction, or after giving up)."""
    if store.execute("SELECT to_regclass('lakefold.capture_slot_intents')").fetchone() \
            != (None,):
        store.execute("DELETE FROM lakefold.capture_slot_intents WHERE slot_name = %s", (slot,))


def check(intent: SlotIntent, *, system_id: str, database: str,
          source: psycopg.Connection[Any]) -> None:
    """Raise unless a slot of that name on ``source`` is absent or the orphan of ``intent``
    (see the module docstring)."""
    if (intent.system_id, intent.database) != (system_id, database):
        raise OwnershipError(
            f"an earlier set-up of slot {intent.slot!r} was interrupted while creating it on "
            f"database {intent.database!r} of another server (system identifier "
            f"{intent.system_id}); a slot it created there would hold WAL until dropped. Drop "
            f"it there if it exists (SELECT pg_drop_replication_slot('{intent.slot}')), then "
            f"run `lakefold capture drop --slot {intent.slot}` with this store, or use another "
            "slot name")
    row = _slot_row(source, intent.slot)
    if row is None:
        return
    plugin, slot_database, restart_lsn = row[0], row[1], row[2]
    if plugin != "pgoutput" or slot_database != database or restart_lsn is None \
            or parse_lsn(restart_lsn) < intent.wal_lsn:
        raise OwnershipError(
            f"replication slot {intent.slot!r} already exists on the source but was not "
            "created by this store's interrupted set-up (it is older, or not a pgoutput slot "
            "of this database): it belongs to another program or another lakefold store. "
            "Choose another slot name, or drop the slot if it is unused")


def discard_orphan(source: psycopg.Connection[Any], store: psycopg.Connection[Any],
                   intent: SlotIntent, *, application_name: str) -> None:
    """Drop the slot an interrupted set-up created (after ``check``), abandon its planned
    snapshot and forget the intent. Only the slot's owner may call this."""
    info = _source_setup.slot_info(source, intent.slot)
    if info is not None:
        if _source_setup.terminate_stale_walsender(source, info, application_name):
            _wait_inactive(source, intent.slot)
        _source_setup.drop_slot(source, intent.slot)
        log.warning("slot %s was created by a capture that stopped before its store recorded "
                    "it; dropped that slot and creating it again", intent.slot)
    with store.transaction():
        if store.execute("SELECT to_regclass('lakefold.capture_snapshots')").fetchone() \
                != (None,):
            store.execute(
                "UPDATE lakefold.capture_snapshots SET status = 'abandoned', finished_at = now() "
                "WHERE slot_name = %s AND status = 'running'", (intent.slot,))
        forget(store, intent.slot)


def _slot_row(source: psycopg.Connection[Any], slot: str) -> tuple[Any, ...] | None:
    row = source.execute(
        "SELECT plugin, database, restart_lsn::text FROM pg_replication_slots "
        "WHERE slot_name = %s", (slot,)).fetchone()
    return None if row is None else tuple(row)


def _wait_inactive(source: psycopg.Connection[Any], slot: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = source.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                             (slot,)).fetchone()
        if row is None or not row[0]:
            return
        time.sleep(0.02)
    raise SlotError(f"the walsender that created slot {slot!r} did not let it go within "
                    f"{timeout:.0f} s; try again, or drop the slot by hand")
