"""Several source databases into one store: which source a slot and a stream prefix belong to,
and how a source is shown.

A capture is one source database (the server's system identifier and the database's name)
writing streams named ``<stream_prefix><schema>.<table>`` into the store. Two rules keep
captures of different sources apart, checked by the set-up before anything is created:

- a slot recorded in the store belongs to its source: a capture of another source with that
  slot name is refused (slot names are per server, so two servers may both default to
  ``lakefold_<database>``; the second one passes ``--slot``);
- a stream prefix belongs to one source: a capture of another source with a prefix some slot of
  the store already uses is refused (two sources that both have ``public.orders`` would write
  one stream). Captures of the *same* source may share a prefix (they capture different
  tables; the stream itself still has one slot, ``ChangelogWriter.ensure_stream``). A new slot's
set-up checks and registers under one advisory lock of the store, so two first starts of two
sources with one prefix cannot both pass (``claim_prefix``).

The default prefix is ``""``, so a single source keeps its stream names; the second source
into a store chooses its own (``--stream-prefix sales.``). A store whose slots were recorded
before prefixes were (``stream_prefix`` null) has each such slot's prefix read off its streams.

A source is shown as ``host:port/database`` as the capture's connection reached it, never with a
role or a password (``source_label``).
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

import psycopg

from lakefold.capture.exceptions import OwnershipError

#: The store's advisory lock under which a new slot's set-up checks its prefix and registers
#: the slot (``claim_prefix``): two sources starting at once cannot both pass the check.
_CLAIM_LOCK: Final = int.from_bytes(hashlib.blake2b(
    b"lakefold.capture-prefixes", digest_size=8).digest(), "big", signed=True)

_PREFIX_OWNER = """
SELECT c.slot_name, c.source_database, c.source FROM lakefold.capture_slots c
WHERE c.slot_name <> %(slot)s
  AND (c.source_system_id, c.source_database) <> (%(system_id)s, %(database)s)
  AND (c.stream_prefix = %(prefix)s OR (c.stream_prefix IS NULL AND EXISTS (
      SELECT 1 FROM lakefold.changelog_streams s WHERE s.slot_name = c.slot_name
         AND s.name = %(prefix)s || s.source_schema || '.' || s.source_table)))
ORDER BY c.slot_name LIMIT 1
"""


def source_label(conn: psycopg.Connection[Any]) -> str:
    """``host:port/database`` of the server and database ``conn`` is connected to (a socket
    directory as the host for a Unix-domain socket); never its role or password."""
    info = conn.info
    return f"{info.host}:{info.port}/{info.dbname}"


def describe(database: str, label: str) -> str:
    """A recorded source for a message: its label when recorded, else its database."""
    return label or f"database {database!r}"


_NEW_SLOT = ("give this capture its own slot and stream prefix, e.g. --slot lakefold_sales "
             "--stream-prefix sales.")


def check_slot_source(slot: str, record: dict[str, Any], *, system_id: str, database: str,
                      remedy: str = _NEW_SLOT) -> None:
    """Raise OwnershipError (ending with ``remedy``) when the store's record of ``slot`` is
    of another source than (``system_id``, ``database``)."""
    if (record["source_system_id"], record["source_database"]) == (system_id, database):
        return
    raise OwnershipError(
        f"slot {slot!r} in this store is the capture of "
        f"{describe(record['source_database'], record.get('source', ''))}, another source; "
        + remedy)


def check_prefix(store: psycopg.Connection[Any], *, slot: str, prefix: str, system_id: str,
                 database: str) -> None:
    """Raise OwnershipError when a slot of another source already uses stream prefix
    ``prefix`` in this store (read before anything is created)."""
    row = store.execute(_PREFIX_OWNER, {"slot": slot, "prefix": prefix, "system_id": system_id,
                                        "database": database}).fetchone()
    if row is None:
        return
    shown = repr(prefix) if prefix else "'' (none)"
    raise OwnershipError(
        f"stream prefix {shown} is used by slot {row[0]!r}, the capture of "
        f"{describe(row[1], row[2])}; two sources in one store need different stream "
        "prefixes: start this capture with one of its own, e.g. --stream-prefix sales. "
        "(and its own --slot)")


def claim_prefix(store: psycopg.Connection[Any]) -> None:
    """Hold the store's prefix lock on this session (a new slot's set-up, from before
    ``check_prefix`` until its slot is registered: ``release_prefix``, or the session's end)."""
    store.execute("SELECT pg_advisory_lock(%s)", (_CLAIM_LOCK,))


def release_prefix(store: psycopg.Connection[Any]) -> None:
    """Release the prefix lock ``claim_prefix`` took on this session."""
    store.execute("SELECT pg_advisory_unlock(%s)", (_CLAIM_LOCK,))


def record_source(store: psycopg.Connection[Any], *, slot: str, prefix: str,
                  label: str) -> None:
    """Record the slot's stream prefix and shown source (each set-up: a store recorded before
    they were gets them, a changed DSN shows its new address)."""
    store.execute(
        "UPDATE lakefold.capture_slots SET stream_prefix = %s, source = %s "
        "WHERE slot_name = %s AND (stream_prefix IS DISTINCT FROM %s OR source <> %s)",
        (prefix, label, slot, prefix, label))
