"""One owner of the store's schema (lakefold.core.migrations): every install goes through the
registry, a store at an older version (or from before the registry) migrates to the newest,
processes installing at once apply each migration once and do not deadlock, a changed
migration gives one clear error, and installing an up-to-date store changes nothing."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from lakefold.core import migrations
from lakefold.core.migrations import (
    MIGRATION_LOCK,
    Component,
    Migration,
    SchemaMigrationError,
    versions,
)
from lakefold.store import ChangelogStore
from tests.fixtures.postgres import TestDatabase

pytestmark = pytest.mark.timeout(180)

# Every install entry point of the store's fixed tables, and the component it migrates.
INSTALL_ALL = """
import psycopg
from lakefold.console._history import install_console_tables
from lakefold.eventstore import EventStore
from lakefold.projections.operators._view_events import install_feeds
from lakefold.projections.plan._view_cuts import install_view_cuts
from lakefold.projections.state._catalog import Catalog
from lakefold.projections.state._deadletters import install_dead_letters
from lakefold.projections.state._deleted_events import install_deleted_times
from lakefold.projections.state._late_events import install_late_events
from lakefold.projections.state._stream_state import install_states
from lakefold.projections.state._window_book import install_window_book
from lakefold.spark._source_cuts import install as install_cuts
from lakefold.spark._source_truncates import FoldKeys
from lakefold.store import ChangelogStore
from lakefold.store.internals import capture_state

def install_all(dsn):
    with ChangelogStore(dsn) as store:
        store.install()
    with psycopg.connect(dsn, autocommit=True) as conn:
        capture_state.install(conn)
        for install in (install_dead_letters, install_late_events, install_deleted_times,
                        install_window_book, install_states, install_view_cuts, install_feeds,
                        install_cuts):
            install(conn)
    with EventStore(dsn) as events:
        events.install()
    with Catalog(dsn) as catalog:
        catalog.install()
    FoldKeys(dsn).install()
    install_console_tables(dsn)
"""
COMPONENTS = {"changelog": 4, "capture_state": 1, "dead_letters": 1, "late_events": 1,
              "deleted_event_times": 1, "view_open_windows": 1, "stream_states": 1,
              "view_cuts": 1, "event_feeds": 1, "commit_cuts": 1, "event_store": 1,
              "catalog": 2, "fold_keys": 1, "console": 1}

# A component of the tests' own: each version leaves a row in ``applied``, so a migration run
# twice shows (the real ones are idempotent and would not).
WIDGETS = Component("test_widgets", (
    Migration(1, "widgets", "CREATE TABLE IF NOT EXISTS lakefold.widgets (id int PRIMARY KEY)",
              "CREATE TABLE IF NOT EXISTS lakefold.applied (version int NOT NULL)",
              "INSERT INTO lakefold.applied VALUES (1)"),
    Migration(2, "widgets.name", "ALTER TABLE lakefold.widgets ADD COLUMN name text",
              "INSERT INTO lakefold.applied VALUES (2)"),
    Migration(3, "widgets by name", "CREATE INDEX widgets_name ON lakefold.widgets (name)",
              "INSERT INTO lakefold.applied VALUES (3)"),
))


def _applied(conn: psycopg.Connection[Any]) -> list[int]:
    return [int(r[0]) for r in conn.execute("SELECT version FROM lakefold.applied ORDER BY 1")]


def _install_all(dsn: str) -> None:
    scope: dict[str, Any] = {}
    exec(INSTALL_ALL, scope)  # noqa: S102 - the same code the processes of the race test run
    scope["install_all"](dsn)


def test_every_install_goes_through_the_registry(pg: TestDatabase) -> None:
    _install_all(pg.dsn)
    with psycopg.connect(pg.dsn) as conn:
        assert versions(conn) == COMPONENTS
        assert {name: c.latest for name, c in migrations.registered().items()
                if name in COMPONENTS} == COMPONENTS


def test_a_component_at_an_older_version_migrates_to_the_newest(pg: TestDatabase) -> None:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        assert migrations.migrate(conn, WIDGETS, to=2) == [1, 2]
        conn.execute("INSERT INTO lakefold.widgets VALUES (1, 'kept')")
        assert versions(conn)["test_widgets"] == 2
        assert migrations.migrate(conn, WIDGETS) == [3]
        assert _applied(conn) == [1, 2, 3]
        assert conn.execute("SELECT name FROM lakefold.widgets").fetchall() == [("kept",)]
        assert conn.execute("SELECT to_regclass('lakefold.widgets_name') IS NOT NULL"
                            ).fetchone() == (True,)


def test_a_changelog_store_at_version_1_migrates_to_the_newest(pg: TestDatabase) -> None:
    from lakefold.store.internals import ddl

    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        assert migrations.migrate(conn, ddl.COMPONENT, to=1) == [1]
        conn.execute("INSERT INTO lakefold.changelog_streams (name, slot_name, source_database, "
                     "source_schema, source_table) VALUES ('public.t', 's', 'd', 'public', 't')")
        conn.execute("INSERT INTO lakefold.changelog_compaction (stream_id, compacted_to, "
                     "removed) SELECT stream_id, 7, 3 FROM lakefold.changelog_streams")
        with ChangelogStore(pg.dsn) as store:
            store.install()
            assert [s.name for s in store.streams()] == ["public.t"]
        assert versions(conn)["changelog"] == ddl.COMPONENT.latest == 4
        assert conn.execute(  # version 2's column, version 3's carried-over extent
            "SELECT s.keyless, c.removed_to, c.expired_to FROM lakefold.changelog_compaction c "
            "LEFT JOIN lakefold.changelog_schemas s USING (stream_id)").fetchall() == [
                (None, 7, 7)]


def test_a_store_from_before_the_registry_is_adopted(pg: TestDatabase) -> None:
    """A store an older lakefold installed: its tables, and ``store_installs`` holding one
    fingerprint per component. Install records every migration and keeps the data."""
    from lakefold.store.internals import ddl

    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA lakefold")
        for migration in ddl.COMPONENT.migrations:
            for statement in migration.statements:
                conn.execute(statement)
        conn.execute("CREATE TABLE lakefold.store_installs (component text PRIMARY KEY, "
                     "fingerprint text NOT NULL, installed_at timestamptz NOT NULL DEFAULT "
                     "now())")
        conn.execute("INSERT INTO lakefold.store_installs VALUES ('changelog', 'abc')")
        conn.execute("INSERT INTO lakefold.changelog_streams (name, slot_name, "
                     "source_database, source_schema, source_table) VALUES ('public.t', 's', "
                     "'d', 'public', 't')")
        _install_all(pg.dsn)
        assert versions(conn) == COMPONENTS
        assert conn.execute("SELECT name, slot_name FROM lakefold.changelog_streams"
                            ).fetchall() == [("public.t", "s")]
        assert conn.execute("SELECT count(*) FROM information_schema.columns WHERE "
                            "table_schema = 'lakefold' AND table_name = 'store_installs' AND "
                            "column_name = 'fingerprint'").fetchone() == (0,)


def test_installing_an_up_to_date_store_is_a_no_op_without_the_lock(pg: TestDatabase) -> None:
    _install_all(pg.dsn)
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        before = conn.execute("SELECT component, version, applied_at FROM "
                              "lakefold.store_installs ORDER BY 1, 2").fetchall()
        assert migrations.migrate(conn, WIDGETS) == [1, 2, 3]
        assert migrations.migrate(conn, WIDGETS) == []
        with psycopg.connect(pg.dsn, autocommit=True) as holder:
            # another process migrating holds the lock: an up-to-date store does not wait for it
            holder.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
            conn.execute("SET statement_timeout = '5s'")
            started = time.monotonic()
            _install_all(pg.dsn)
            assert migrations.migrate(conn, WIDGETS) == []
            assert time.monotonic() - started < 5
        assert _applied(conn) == [1, 2, 3]
        after = conn.execute("SELECT component, version, applied_at FROM "
                             "lakefold.store_installs WHERE component <> 'test_widgets' "
                             "ORDER BY 1, 2").fetchall()
        assert after == before


def test_a_changed_migration_gives_one_clear_error(pg: TestDatabase) -> None:
    edited = Component("test_widgets", (
        WIDGETS.migrations[0],
        Migration(2, "widgets.name", "ALTER TABLE lakefold.widgets ADD COLUMN name varchar",
                  "INSERT INTO lakefold.applied VALUES (2)"),
        WIDGETS.migrations[2]))
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        migrations.migrate(conn, WIDGETS)
        with pytest.raises(SchemaMigrationError,
                           match=r"migration 'test_widgets' version 2 \(widgets.name\) was "
                                 r"applied to this store with other DDL.*add the change as a "
                                 r"new version"):
            migrations.migrate(conn, edited)
        # a real component: the changelog store refuses to open a store whose record differs
        with ChangelogStore(pg.dsn) as store:
            store.install()
        conn.execute("UPDATE lakefold.store_installs SET checksum = 'f00' "
                     "WHERE component = 'changelog' AND version = 2")
        with ChangelogStore(pg.dsn) as store, pytest.raises(
                SchemaMigrationError, match=r"'changelog' version 2 .*checksum f00 recorded"):
            store.install()


def test_a_store_newer_than_the_code_is_refused(pg: TestDatabase) -> None:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        migrations.migrate(conn, WIDGETS)
        older = Component("test_widgets", WIDGETS.migrations[:2])
        with pytest.raises(SchemaMigrationError, match=r"version 3, newer than this lakefold "
                                                       r"knows \(2\); upgrade lakefold"):
            migrations.migrate(conn, older)


def test_versions_are_numbered_from_1_in_order() -> None:
    with pytest.raises(SchemaMigrationError, match=r"versions \[1, 3\]; number them"):
        migrations.register("test_gap", Migration(1, "a", "SELECT 1"),
                            Migration(3, "b", "SELECT 1"))


def test_threads_migrating_at_once_apply_each_migration_once(pg: TestDatabase) -> None:
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def run() -> None:
        try:
            with psycopg.connect(pg.dsn, autocommit=True) as conn:
                start.wait()
                migrations.migrate(conn, WIDGETS)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    with psycopg.connect(pg.dsn) as conn:
        assert _applied(conn) == [1, 2, 3]


RACER = INSTALL_ALL + """
import sys, time
from pathlib import Path
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.005)
install_all(sys.argv[1])
print("installed", flush=True)
"""


def test_processes_installing_at_once_do_not_deadlock(pg: TestDatabase, tmp_path: Path) -> None:
    go = tmp_path / "go"
    children = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(RACER), pg.dsn, str(go)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(4)]
    try:
        time.sleep(3)  # every child imported lakefold and is waiting
        go.touch()
        outcomes = [child.communicate(timeout=120) for child in children]
    finally:
        for child in children:
            child.kill()
    assert [c.returncode for c in children] == [0] * 4, [err for _, err in outcomes]
    assert all(out.strip() == "installed" for out, _ in outcomes)
    with psycopg.connect(pg.dsn) as conn:
        assert versions(conn) == COMPONENTS
        rows = conn.execute("SELECT count(*), count(DISTINCT (component, version)) "
                            "FROM lakefold.store_installs").fetchone()
        assert rows == (sum(COMPONENTS.values()), sum(COMPONENTS.values()))
