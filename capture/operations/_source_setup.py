"""The source database: checks before capturing, the publication lakefold owns, and slots
(the catalog lookups for Relation messages are ``decoding._source_catalog``).

Everything here runs over ordinary (non-replication) connections. The checks run before
anything is created, so a misconfigured source gets a clear error and nothing half-made.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Final

import psycopg
from psycopg import errors, sql

from lakefold.capture._config import TableRef
from lakefold.capture.decoding import _publishable
from lakefold.capture.exceptions import (
    OwnershipError,
    SlotError,
    SourceConfigurationError,
)
from lakefold.capture.operations import _publication_guard
from lakefold.core.wal import parse_lsn

log = logging.getLogger(__name__)

#: Marks a publication as created and managed by lakefold (its COMMENT).
PUBLICATION_MARKER: Final = "lakefold capture publication"


@dataclass(frozen=True, slots=True)
class SlotInfo:
    """A replication slot as ``pg_replication_slots`` shows it."""

    name: str
    plugin: str | None
    slot_type: str
    database: str | None
    active_pid: int | None
    confirmed_flush_lsn: int | None
    wal_status: str | None


def check_source(conn: psycopg.Connection[Any]) -> None:
    """wal_level must be logical and the role must be allowed to replicate."""
    (wal_level,) = conn.execute("SHOW wal_level").fetchone() or ("?",)
    if wal_level != "logical":
        raise SourceConfigurationError(
            f"wal_level is {wal_level!r} on the source; set wal_level = logical in "
            "postgresql.conf (ALTER SYSTEM SET wal_level = logical) and restart the server"
        )
    row = conn.execute(
        "SELECT current_user, rolreplication OR rolsuper FROM pg_roles "
        "WHERE rolname = current_user"
    ).fetchone()
    if row is None or not row[1]:
        user = row[0] if row else "?"
        raise SourceConfigurationError(
            f"role {user!r} lacks the REPLICATION attribute needed to read the WAL; run "
            f"ALTER ROLE {user} REPLICATION as a superuser, or capture as a role that has it"
        )


def system_identity(conn: psycopg.Connection[Any]) -> tuple[str, str]:
    """(system identifier, database name) of the source."""
    row = conn.execute(
        "SELECT system_identifier::text, current_database() FROM pg_control_system()"
    ).fetchone()
    if row is None:
        raise SourceConfigurationError("cannot read the source's system identifier")
    return str(row[0]), str(row[1])


def resolve_tables(conn: psycopg.Connection[Any], *, schema: str | None,
                   tables: tuple[TableRef, ...], require_keys: bool = True) -> list[int]:
    """Check what the capture covers and return the OIDs of its publishable tables (see
    ``_publishable``). A schema must exist and not be lakefold's; its tables that are not
    publishable are left out (``reconcile`` warns about them). Listed tables must exist, be
    ordinary or partitioned tables and not lakefold's; one that is not publishable is an error
    for a new capture (``require_keys``) and is left out, with a warning, by a running one."""
    if schema is not None:
        if schema == "lakefold":
            raise SourceConfigurationError(
                "schema 'lakefold' holds lakefold's own store; it is never captured. Capture "
                "your application's schema instead"
            )
        exists = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                              (schema,)).fetchone()
        if exists is None:
            raise SourceConfigurationError(
                f"schema {schema!r} does not exist in the source database; check the name")
        return [s.relid for s in _publishable.candidates(conn, _publishable.Scope(schema))
                if s.reason is None]
    for ref in tables:
        if ref.schema == "lakefold":
            raise SourceConfigurationError(
                f"{ref} belongs to lakefold's own store and is never captured")
        row = conn.execute(
            "SELECT c.oid, c.relkind FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
            (ref.schema, ref.table),
        ).fetchone()
        if row is None:
            raise SourceConfigurationError(
                f"table {ref} does not exist in the source database; check the name")
        if row[1] not in ("r", "p"):
            raise SourceConfigurationError(
                f"{ref} is not a table (relkind {row[1]!r}); only tables can be captured")
    states = _publishable.candidates(conn, _publishable.Scope(
        None, tuple((t.schema, t.table) for t in tables)))
    unfit = [s for s in states if s.reason is not None]
    if unfit and require_keys:
        raise SourceConfigurationError(
            f"table(s) {', '.join(s.qualified for s in unfit)} have no primary key or no "
            "usable replica identity, so changes cannot be keyed or PostgreSQL would refuse "
            "UPDATE/DELETE on them once published: "
            + "; ".join(f"{s.qualified}: {s.reason} (fix: {s.fix})" for s in unfit)
            + ". Fix that (add a primary key), or leave them out of the capture")
    return [s.relid for s in states if s.reason is None]


def check_guard(conn: psycopg.Connection[Any], *, schema: str | None) -> bool:
    """Whether the capture can install its publication guard (``_publication_guard``: needs a
    superuser). A schema capture cannot do without it: raises SourceConfigurationError. A
    capture of listed tables goes on with a warning."""
    if _publication_guard.can_install(conn):
        return True
    if schema is not None:
        raise SourceConfigurationError(
            f"capturing schema {schema!r} needs a superuser on the source: lakefold installs "
            "an event trigger there that keeps tables without a primary key out of the "
            "publication as they are created or altered (PostgreSQL would refuse their UPDATE "
            "and DELETE otherwise). Capture as a superuser, or list the tables (--table)")
    log.warning(
        "the capture role is not a superuser, so lakefold cannot install its publication guard "
        "(an event trigger) on the source: if a captured table loses its primary key, "
        "PostgreSQL refuses UPDATE and DELETE on it until the running capture takes it out of "
        "the publication (within seconds). Capture as a superuser to close that gap")
    return False


def publication_comment(conn: psycopg.Connection[Any], name: str) -> tuple[bool, str | None]:
    """(exists, comment) of publication ``name``."""
    row = conn.execute(
        "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = %s",
        (name,),
    ).fetchone()
    return (row is not None, row[0] if row else None)


def ensure_publication(conn: psycopg.Connection[Any], name: str, *, schema: str | None,
                       tables: tuple[TableRef, ...],
                       guard: bool = False) -> _publishable.Reconciliation:
    """Create publication ``name`` or bring lakefold's existing one up to date, install the
    publication guard when ``guard``, and make the publication list exactly the publishable
    tables of the schema or list (``_publishable.reconcile``; always table by table: ``FOR
    TABLES IN SCHEMA`` would publish a table created later without a key). Refuses a
    publication lakefold did not create."""
    exists, comment = publication_comment(conn, name)
    if exists and comment != PUBLICATION_MARKER:
        raise OwnershipError(
            f"publication {name!r} already exists and was not created by lakefold; lakefold "
            "only captures through a publication it owns. Choose another publication name, "
            "or drop that publication if it is unused"
        )
    scope = _publishable.Scope(schema, tuple((t.schema, t.table) for t in tables))
    try:
        with conn.transaction():
            # Partitioned tables are published as their root table: one stream per table,
            # whatever partition a row lives in.
            if exists:
                conn.execute(sql.SQL(
                    "ALTER PUBLICATION {} SET (publish_via_partition_root = true)").format(
                    sql.Identifier(name)))
            else:
                conn.execute(sql.SQL(
                    "CREATE PUBLICATION {} WITH (publish_via_partition_root = true)"
                ).format(sql.Identifier(name)))
                conn.execute(sql.SQL("COMMENT ON PUBLICATION {} IS {}").format(
                    sql.Identifier(name), sql.Literal(PUBLICATION_MARKER)))
            if guard:
                _publication_guard.install(conn, name, scope)
            return _publishable.reconcile(conn, name, scope)
    except errors.InsufficientPrivilege as e:
        raise SourceConfigurationError(
            f"not allowed to create or alter publication {name!r}: {e.diag.message_primary}; "
            "capture as the tables' owner (a whole schema needs a superuser), or create the "
            "publication as a superuser and COMMENT ON PUBLICATION ... IS "
            f"'{PUBLICATION_MARKER}'"
        ) from e


def slot_info(conn: psycopg.Connection[Any], name: str) -> SlotInfo | None:
    """The slot called ``name``, or None."""
    row = conn.execute(
        "SELECT slot_name, plugin, slot_type, database, active_pid, "
        "confirmed_flush_lsn::text, wal_status FROM pg_replication_slots WHERE slot_name = %s",
        (name,),
    ).fetchone()
    if row is None:
        return None
    return SlotInfo(row[0], row[1], row[2], row[3], row[4],
                    parse_lsn(row[5]) if row[5] else None, row[6])


def check_slot(slot: SlotInfo, *, database: str, application_name: str) -> None:
    """An existing slot must be a pgoutput slot of this database, not in use by another
    program; raises OwnershipError or SlotError otherwise."""
    if slot.slot_type != "logical" or slot.plugin != "pgoutput":
        raise OwnershipError(
            f"replication slot {slot.name!r} exists but is a {slot.slot_type} slot with plugin "
            f"{slot.plugin!r}, not lakefold's (pgoutput); choose another slot name, or drop it "
            "with SELECT pg_drop_replication_slot(...) if it is unused"
        )
    if slot.database != database:
        raise OwnershipError(
            f"replication slot {slot.name!r} belongs to database {slot.database!r}, not "
            f"{database!r}; choose another slot name"
        )
    if slot.wal_status == "lost":
        raise SlotError(
            f"replication slot {slot.name!r} was invalidated (the server removed WAL it "
            "needed, see max_slot_wal_keep_size); changes were lost. Drop the slot "
            "(lakefold capture drop) and capture again from a new snapshot"
        )
    del application_name


def terminate_stale_walsender(conn: psycopg.Connection[Any], slot: SlotInfo,
                              application_name: str) -> bool:
    """If ``slot`` is held by a walsender of an earlier run of this capture (same application
    name), end it and return True; if held by anything else, raise SlotError."""
    if slot.active_pid is None:
        return False
    row = conn.execute("SELECT application_name FROM pg_stat_activity WHERE pid = %s",
                       (slot.active_pid,)).fetchone()
    if row is not None and row[0] != application_name:
        raise SlotError(
            f"replication slot {slot.name!r} is in use by process {slot.active_pid} "
            f"(application {row[0]!r}); another program is reading it. Stop that program or "
            "choose another slot name"
        )
    conn.execute("SELECT pg_terminate_backend(%s)", (slot.active_pid,))
    return True


def drop_slot(conn: psycopg.Connection[Any], name: str) -> bool:
    """Drop slot ``name`` if it exists; True when dropped."""
    try:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))
    except errors.UndefinedObject:
        return False
    return True
