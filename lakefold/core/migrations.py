"""One owner of the store's schema: the ordered, versioned migrations of every table lakefold
creates in schema ``lakefold`` of the store database, applied once and recorded.

Each package registers its own *component* here (this module sits in the lowest layer, so the
store, the event store, capture, spark, projections and the console can all use it without
importing each other): ``register("changelog", Migration(1, ...), Migration(2, ...))`` in the
module that owns those tables. ``migrate(conn, component)`` brings the component to its
latest version; every ``install*`` function of lakefold is such a call.

The components (``registered()`` lists those imported so far)::

    changelog          lakefold.store._ddl            the changelog store, capture slots/owners
    capture_state      lakefold.store._capture_state  snapshots, capture control, heartbeats
    event_store        lakefold.eventstore._ddl       streams, events, runs, positions, functions
    aggregate_snapshots lakefold.eventstore._repository
    commit_cuts        lakefold.spark._source_cuts
    fold_keys          lakefold.spark._source_truncates
    catalog            lakefold.projections.state._catalog
    dead_letters       lakefold.projections.state._deadletters
    late_events        lakefold.projections.state._late_events
    deleted_event_times lakefold.projections.state._deleted_events
    view_open_windows  lakefold.projections.state._window_book
    stream_states      lakefold.projections.state._stream_state
    table_histories    lakefold.projections.state._table_history
    view_cuts          lakefold.projections.plan._view_cuts
    event_feeds        lakefold.projections.operators._view_events
    console            lakefold.console._history

How a migration is applied
--------------------------
``lakefold.store_installs`` records ``(component, version, checksum, description,
applied_at)``, one row per migration applied. ``migrate``:

1. reads the component's rows without a lock; when every migration is recorded with the
   checksum of its code it returns at once: no DDL, no lock (an ``ALTER`` or ``CREATE INDEX``
   run again takes table locks that deadlock with a view's batch or a capture writing meanwhile,
   which is what 2aed5d6 fixed for the changelog store);
2. otherwise, in one transaction, takes the migrations' advisory lock
   (``pg_advisory_xact_lock(MIGRATION_LOCK)``), reads the rows again (a
   process that installed meanwhile is seen), checks every recorded checksum, and applies each
   missing migration in version order, recording it in the same transaction. Two processes
   installing at once: one applies, the other waits on the lock and then finds nothing to do.

A recorded checksum that differs from the code's raises ``SchemaMigrationError`` naming the
component and version: a released migration is never edited, a change is a new version.

Every migration is idempotent (``IF NOT EXISTS``, ``CREATE OR REPLACE``, ``DO`` blocks that
look before they change). Version 1 of each component is the DDL lakefold ran before this
registry, with the in-place upgrades it carried, so a store installed by an older lakefold (no
rows here, or the ``store_installs`` of one fingerprint per component, which is replaced) is
migrated by running it: it creates what is missing and changes nothing else. For the same
reason a component whose migrations are all recorded but whose objects are not in place (a
table dropped by hand; the condition a component registers with ``expect``) is repaired by
running its migrations again (``in_place``): the fast path checks the tables exist.

Not here: tables created per object at run time, whose names come from a view, a stream or a
slot, so there is no fixed DDL to register. They stay created where they are used:

* ``lakefold.capture_staging_<slot>`` (``lakefold.store._ddl.create_staging``);
* the per-stream state tables in schema ``lakefold_state`` (``projections.state._stream_state``)
  and the per-stream history tables (``projections.state._table_history``);
* a view's kept-aggregate tables (``projections.operators._view_aggregates``), window-fold
  tables (``projections.operators._window_aggregates``) and lookup markers
  (``projections.operators._lookups``);
* the publication guard's objects (``capture.operations._publication_guard``), installed in
  the *source* database per publication, and the event store's commit-marker trigger
  (``eventstore._commit_markers``), installed on demand when a view needs commit order.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, LiteralString

import psycopg
from psycopg import errors, sql
from psycopg.rows import tuple_row

from lakefold.core.exceptions import TerminalError

#: The advisory lock of every migration, whatever the component: one lock cannot deadlock
#: against itself when a transaction migrates several components, and it is only taken when a
#: migration is missing (a store being installed or upgraded), never on the fast path.
MIGRATION_LOCK: Final = 0x6C66_4D47  # "lfMG"

#: The record of applied migrations. Stores from before the registry had a table of this name
#: with one fingerprint per component (no ``version`` column): it is replaced (see _bootstrap).
_RECORD_DDL: Final = """CREATE TABLE IF NOT EXISTS lakefold.store_installs (
    component text NOT NULL,
    version integer NOT NULL CHECK (version >= 1),
    checksum text NOT NULL,
    description text NOT NULL DEFAULT '',
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (component, version))"""

_HAS_RECORD: Final = (
    "SELECT to_regclass('lakefold.store_installs') IS NOT NULL AND EXISTS (SELECT FROM "
    "information_schema.columns WHERE table_schema = 'lakefold' AND table_name = "
    "'store_installs' AND column_name = 'version')")

Statement = LiteralString | sql.SQL | sql.Composed
_TABLE_DDL: Final = re.compile(
    r"\b(CREATE (?:UNLOGGED )?TABLE IF NOT EXISTS|DROP TABLE(?: IF EXISTS)?) (lakefold\.\w+)",
    re.IGNORECASE)


class SchemaMigrationError(TerminalError):
    """The store's schema does not match lakefold's migrations (an edited migration, or a
    store migrated by a newer lakefold)."""


@dataclass(frozen=True)
class Migration:
    """One step of a component's schema: its version (1, 2, ... dense), what it does, and its
    statements, run in order in one transaction."""

    version: int
    description: str
    statements: tuple[Statement, ...] = field(repr=False)

    def __init__(self, version: int, description: str, *statements: Statement) -> None:
        object.__setattr__(self, "version", version)
        object.__setattr__(self, "description", description)
        object.__setattr__(self, "statements", statements)

    @property
    def texts(self) -> tuple[str, ...]:
        """The statements as text."""
        return tuple(s if isinstance(s, str) else s.as_string() for s in self.statements)

    @property
    def checksum(self) -> str:
        """sha256 of the statements' text, whitespace folded (re-indenting is no change)."""
        digest = hashlib.sha256()
        for text in self.texts:
            digest.update(" ".join(text.split()).encode())
            digest.update(b"\0")
        return digest.hexdigest()


@dataclass(frozen=True)
class Component:
    """A named group of tables and its migrations, oldest first."""

    name: str
    migrations: tuple[Migration, ...]
    #: An SQL condition that holds when the component's objects are as its migrations left
    #: them, beyond its tables being there (see ``in_place``).
    expect: LiteralString | None = None

    @property
    def latest(self) -> int:
        return self.migrations[-1].version

    def tables(self, version: int) -> tuple[str, ...]:
        """The tables the migrations up to ``version`` create and do not drop again."""
        tables: dict[str, None] = {}
        for migration in self.migrations[:version]:
            for text in migration.texts:
                for verb, table in _TABLE_DDL.findall(text):
                    if verb.upper().startswith("DROP"):
                        tables.pop(table, None)
                    else:
                        tables[table] = None
        return tuple(tables)


_REGISTRY: dict[str, Component] = {}


def register(name: str, *migrations: Migration,
             expect: LiteralString | None = None) -> Component:
    """Register ``name``'s migrations (versions 1..n in order) and return the component;
    ``expect``: an SQL condition that holds when its objects are in place (besides its tables
    existing, which is always checked). Registering the same migrations again (a module
    reloaded) is a no-op; different ones under a registered name raise."""
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(migrations) + 1)):
        raise SchemaMigrationError(
            f"the migrations of {name!r} have versions {versions}; number them 1, 2, 3... in "
            "the order they apply")
    component = Component(name, tuple(migrations), expect)
    known = _REGISTRY.get(name)
    if known is not None and [m.checksum for m in known.migrations] != [
            m.checksum for m in migrations]:
        raise SchemaMigrationError(
            f"schema component {name!r} is registered twice with different migrations; give "
            "one of them another name")
    _REGISTRY[name] = component
    return component


def registered() -> Mapping[str, Component]:
    """The components registered so far (those whose modules were imported), by name."""
    return dict(_REGISTRY)


def _rows(conn: psycopg.Connection[Any], query: LiteralString,
          params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows as tuples, whatever the connection's row factory (the catalog's is dict_row)."""
    with conn.cursor(row_factory=tuple_row) as cur:
        return cur.execute(query, params).fetchall()


def _has_record(conn: psycopg.Connection[Any]) -> bool:
    """True when the store has this registry's record table (not a new store, nor one from
    before the registry)."""
    return bool(_rows(conn, _HAS_RECORD)[0][0])


def _records(conn: psycopg.Connection[Any], name: str) -> dict[int, str] | None:
    """The recorded migrations of ``name`` (version → checksum); ``None`` when the store has
    no record table of this registry."""
    if not _has_record(conn):
        return None
    rows = _rows(conn, "SELECT version, checksum FROM lakefold.store_installs "
                 "WHERE component = %s", (name,))
    return {int(r[0]): str(r[1]) for r in rows}


def _check(component: Component, records: Mapping[int, str]) -> list[Migration]:
    """The migrations of ``component`` not recorded yet; raises on a changed checksum or a
    version newer than the code knows."""
    by_version = {m.version: m for m in component.migrations}
    for version, checksum in sorted(records.items()):
        migration = by_version.get(version)
        if migration is None:
            raise SchemaMigrationError(
                f"the store has schema {component.name!r} at version {version}, newer than this "
                f"lakefold knows ({component.latest}); upgrade lakefold, or use a store of its "
                "version")
        if checksum != migration.checksum:
            raise SchemaMigrationError(
                f"migration {component.name!r} version {version} ({migration.description}) was "
                "applied to this store with other DDL than this lakefold's (checksum "
                f"{checksum[:12]} recorded, {migration.checksum[:12]} in the code); a released "
                "migration must not change: restore it and add the change as a new version")
    return [m for m in component.migrations if m.version not in records]


def _create_if_missing(conn: psycopg.Connection[Any], statement: LiteralString) -> None:
    """Run a ``CREATE ... IF NOT EXISTS`` that another process may be running at the same time
    (it is not atomic against itself: the loser gets a unique violation on the catalog, after
    the winner committed, and then the object is there)."""
    try:
        with conn.transaction():
            conn.execute(statement)
    except (errors.UniqueViolation, errors.DuplicateSchema, errors.DuplicateTable):
        pass  # created concurrently by another process: that is what we wanted


def _bootstrap(conn: psycopg.Connection[Any]) -> None:
    """Schema ``lakefold`` and the record table, in the caller's transaction. The record table
    of a store from before the registry (component → fingerprint) is dropped: its rows say only
    that some version-1 DDL ran, and version 1 is safe to run again."""
    _create_if_missing(conn, "CREATE SCHEMA IF NOT EXISTS lakefold")
    legacy = _rows(
        conn, "SELECT EXISTS (SELECT FROM information_schema.columns WHERE table_schema = "
        "'lakefold' AND table_name = 'store_installs' AND column_name = 'fingerprint')")
    if legacy[0][0]:
        conn.execute("DROP TABLE lakefold.store_installs")
    conn.execute(_RECORD_DDL)


def in_place(conn: psycopg.Connection[Any], component: Component,
             version: int | None = None) -> bool:
    """True when the tables of ``component`` up to ``version`` (default: latest) exist and its
    ``expect`` condition holds."""
    tables = component.tables(component.latest if version is None else version)
    query: LiteralString = "SELECT bool_and(to_regclass(t) IS NOT NULL) FROM unnest(%s::text[]) t"
    if component.expect is not None:
        query = "SELECT coalesce((" + query + "), true) AND (" + component.expect + ")"
    return bool(_rows(conn, query, (list(tables),))[0][0] is not False)


def migrate(conn: psycopg.Connection[Any], component: Component, *,
            to: int | None = None) -> list[int]:
    """Bring ``component``'s tables to version ``to`` (default: its latest) and return the
    versions applied now (``[]`` when it was there already). Idempotent and safe to run from
    several processes at once (see the module docstring). In the caller's transaction when
    there is one (then the lock is held until it ends), else in a transaction of its own.
    Raises ``SchemaMigrationError`` when a recorded migration differs from the code."""
    target = component.latest if to is None else to
    wanted = [m for m in component.migrations if m.version <= target]
    records = _records(conn, component.name)
    if (records is not None and not _pending(component, records, wanted)
            and in_place(conn, component, target)):
        return []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        _bootstrap(conn)
        records = _records(conn, component.name) or {}
        pending = _pending(component, records, wanted)
        if not pending and not in_place(conn, component, target):
            # Recorded, but objects are missing (dropped by hand, or a store an older lakefold
            # left): every migration is idempotent, so running them all again repairs it.
            pending = wanted
        for migration in pending:
            for statement in migration.statements:
                conn.execute(statement)
            conn.execute(
                "INSERT INTO lakefold.store_installs (component, version, checksum, description) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (component, version) DO UPDATE SET "
                "applied_at = now()",
                (component.name, migration.version, migration.checksum, migration.description))
        return [m.version for m in pending]


def _pending(component: Component, records: Mapping[int, str],
             wanted: Sequence[Migration]) -> list[Migration]:
    missing = {m.version for m in _check(component, records)}
    return [m for m in wanted if m.version in missing]


def versions(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """The highest recorded version of each component in the store (empty: none recorded)."""
    if not _has_record(conn):
        return {}
    rows = _rows(conn, "SELECT component, max(version) FROM lakefold.store_installs "
                 "GROUP BY component")
    return {str(r[0]): int(r[1]) for r in rows}
