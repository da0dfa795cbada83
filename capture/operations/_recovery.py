"""Recovering a capture whose slot was invalidated or lost (``lakefold capture recover``).

An invalidated slot means changes were lost (``_slot_health.SlotInvalidatedError`` says why).
``recover`` drops the slot, writes a truncate record into each of the capture's streams (so
readers forget rows whose deletes were lost) and sets the capture up again from a fresh initial
snapshot. It sits above both the capture (``_capture``) and slot health, which the capture uses
to explain a failure, so that neither imports the other back.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import psycopg

from lakefold.capture._options import SnapshotPolicy
from lakefold.capture.operations._capture import Capture, drop_capture
from lakefold.store.internals import NOTIFY_CHANNEL

if TYPE_CHECKING:
    from lakefold.capture._config import CaptureConfig
    from lakefold.capture.snapshots._initial_snapshot import SnapshotListener


def recover(config: CaptureConfig, *, listener: SnapshotListener | None = None) -> None:
    """Recover a capture whose slot was invalidated or lost (see the module docstring): drop
    the slot, write a truncate record into each of its streams, and set the capture up again
    with a fresh initial snapshot (``Capture.setup``). Safe to run again after a failure."""
    store_dsn = config.resolved_store_dsn
    drop_capture(config.source_dsn, store_dsn, slot=config.slot,
                 publication=config.publication)
    with psycopg.connect(store_dsn, autocommit=True, connect_timeout=10) as store:
        truncate_streams(store, config.slot)
    policy = config.snapshot if config.snapshot.initial else SnapshotPolicy(
        initial=True, chunk_rows=config.snapshot.chunk_rows)
    Capture(replace(config, snapshot=policy), listener=listener).setup()


def truncate_streams(store: psycopg.Connection[Any], slot: str) -> list[str]:
    """Append a truncate record to every stream of ``slot`` (one store transaction); returns
    the stream names."""
    if store.execute("SELECT to_regclass('lakefold.changelog_streams')").fetchone() == (None,):
        return []
    with store.transaction():
        rows = store.execute(
            "SELECT stream_id, name, greatest(head, lakefold.changelog_top(stream_id)), "
            "schema_version "
            "FROM lakefold.changelog_streams s WHERE slot_name = %s ORDER BY stream_id "
            "FOR UPDATE", (slot,)).fetchall()
        for stream_id, _name, top, version in rows:
            if not version:
                continue  # never had a change or snapshot: nothing to forget
            store.execute(
                "INSERT INTO lakefold.changelog (stream_id, position, ordinal, commit_lsn, xid, "
                "commit_ts, schema_version, op) VALUES (%s, %s, 1, 0, 0, now(), %s, 't')",
                (stream_id, int(top) + 1, max(int(version), 1)))
            store.execute(
                "UPDATE lakefold.changelog_streams SET head = %s, last_commit_ts = now() "
                "WHERE stream_id = %s", (int(top) + 1, stream_id))
            store.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, _name))
    return [r[1] for r in rows if r[3]]
