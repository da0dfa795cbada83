"""The capture never makes the source's own statements fail (issue 18, item 3).

PostgreSQL refuses UPDATE and DELETE on a published table without a replica identity. With DDL
while capturing, the application's statements must keep working: a table without a usable key
stays out of the publication (a warning names it and the fix, in the session, the log and
``capture status``), and is captured from a fresh snapshot once it has one; its stream then
equals the table (SQL oracle), including the rows changed and deleted while it was out.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from psycopg import sql

from lakefold.capture import (
    Capture,
    CaptureConfig,
    ChangelogStore,
    SourceConfigurationError,
    UnknownStreamError,
    slot_health,
)
from lakefold.capture.operations._capture import drop_capture
from lakefold.store import _capture_state as snapshot_state
from tests.capture.conftest import (
    capture_now,
    capture_settled,
    execute,
    replayed_rows,
    running_capture,
    source_rows,
    stream_records,
)
from tests.fixtures.postgres import PostgresServer, TestDatabase, drop_database

pytestmark = pytest.mark.timeout(240)


# -- helpers -----------------------------------------------------------------------------------

def published(dsn: str, publication: str = "lakefold") -> list[str]:
    with psycopg.connect(dsn) as conn:
        return sorted(f"{r[0]}.{r[1]}" for r in conn.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
            (publication,)).fetchall())


def not_captured(config: CaptureConfig) -> list[str]:
    return [t["table"] for t in slot_health(config).tables_not_captured]


def assert_stream_equals_table(dsn: str, table: str) -> None:
    with ChangelogStore(dsn) as store:
        assert replayed_rows(store, table) == source_rows(dsn, table)


def wait_for(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.2)


class App:
    """The application's own session: every statement must succeed; WARNINGs are kept."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.warnings: list[tuple[str, str]] = []
        self.conn.add_notice_handler(lambda d: self.warnings.append(
            (d.message_primary or "", d.message_hint or "")) if d.severity == "WARNING"
            else None)

    def run(self, *statements: str | sql.SQL | sql.Composed) -> None:
        for statement in statements:
            self.conn.execute(statement.encode() if isinstance(statement, str) else statement)

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def app(pg: TestDatabase) -> Iterator[App]:
    session = App(pg.dsn)
    try:
        yield session
    finally:
        session.close()


# -- DDL while a capture runs ------------------------------------------------------------------

def test_keyless_table_created_under_a_running_schema_capture(pg: TestDatabase,
                                                              app: App) -> None:
    app.run("CREATE TABLE t (id int PRIMARY KEY, v text)", "INSERT INTO t VALUES (1, 'a')")
    config = CaptureConfig(source_dsn=pg.dsn, schema="public", slot="guard_run")
    Capture(config).setup()
    stop, thread, errors = running_capture(config)
    try:
        app.run("CREATE TABLE late_keyless (v int)",
                "INSERT INTO late_keyless VALUES (1), (2), (3)",
                "UPDATE late_keyless SET v = 10 WHERE v = 1",  # refused before the fix
                "DELETE FROM late_keyless WHERE v = 2")
        assert any("public.late_keyless is not captured" in message
                   and "no primary key" in message and "ADD PRIMARY KEY" in hint
                   for message, hint in app.warnings), app.warnings
        assert published(pg.dsn) == ["public.t"]
        health = slot_health(config)
        assert health.status == "warning"
        assert [t["table"] for t in health.tables_not_captured] == ["public.late_keyless"]
        assert any("public.late_keyless is not captured" in p and "ADD PRIMARY KEY" in p
                   for p in health.problems), health.problems
        assert health.as_dict()["tables_not_captured"][0]["fix"].startswith(
            "ALTER TABLE public.late_keyless ADD PRIMARY KEY")

        # it gains a key: captured from a fresh snapshot, then streamed
        app.run("ALTER TABLE late_keyless ADD COLUMN id serial PRIMARY KEY",
                "UPDATE late_keyless SET v = v + 1", "INSERT INTO late_keyless VALUES (7)",
                "DELETE FROM late_keyless WHERE v = 4")
        assert published(pg.dsn) == ["public.late_keyless", "public.t"]

        def caught_up() -> bool:
            with ChangelogStore(pg.dsn) as store:
                try:
                    return replayed_rows(store, "public.late_keyless") == source_rows(
                        pg.dsn, "public.late_keyless")
                except UnknownStreamError:
                    return False

        wait_for(caught_up, "the stream of late_keyless equals the table")
        assert not_captured(config) == []
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not errors, errors
    assert_stream_equals_table(pg.dsn, "public.t")


def test_temporary_tables_are_left_alone(pg: TestDatabase, app: App) -> None:
    """Applications create temporary tables often, with or without keys: the guard neither
    publishes nor warns about them, and their statements work."""
    app.run("CREATE TABLE t (id int PRIMARY KEY)")
    config = CaptureConfig(source_dsn=pg.dsn, schema="public", slot="guard_temp")
    Capture(config).setup()
    app.run("CREATE TEMP TABLE scratch (v int)", "INSERT INTO scratch VALUES (1), (2)",
            "UPDATE scratch SET v = 3 WHERE v = 1", "DELETE FROM scratch WHERE v = 2",
            "ALTER TABLE scratch ADD COLUMN id int PRIMARY KEY GENERATED ALWAYS AS IDENTITY",
            "ALTER TABLE scratch DROP CONSTRAINT scratch_pkey", "DROP TABLE scratch",
            "CREATE TEMP TABLE keyed (id int PRIMARY KEY) ON COMMIT DROP")
    assert app.warnings == []
    assert published(pg.dsn) == ["public.t"]
    assert not_captured(config) == []


def test_dropping_a_captured_key_and_adding_it_back(pg: TestDatabase, app: App) -> None:
    app.run("CREATE TABLE t (id int PRIMARY KEY, v text)",
            "INSERT INTO t SELECT g, 'a' FROM generate_series(1, 20) g")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("t",), slot="guard_rekey")
    Capture(config).setup()
    capture_settled(config)
    app.run("ALTER TABLE t DROP CONSTRAINT t_pkey",
            # the application goes on while the table has no key
            "UPDATE t SET v = 'while out' WHERE id <= 5", "DELETE FROM t WHERE id > 15",
            "INSERT INTO t VALUES (100, 'new while out')")
    assert any("public.t is no longer captured" in m and "ADD PRIMARY KEY" in h
               for m, h in app.warnings), app.warnings
    capture_settled(config)
    assert published(pg.dsn) == []
    health = slot_health(config)
    assert health.status == "warning" and not_captured(config) == ["public.t"]
    assert health.tables_refused == ()

    app.run("ALTER TABLE t ADD PRIMARY KEY (id)", "UPDATE t SET v = 'back' WHERE id = 1")
    capture_settled(config)
    assert_stream_equals_table(pg.dsn, "public.t")  # deletes and updates while out included
    ops = [op for _, _, _, op in stream_records(pg.dsn, "public.t")]
    assert ops.count("t") == 1  # the rejoin's truncate, then a fresh read of every row
    assert not_captured(config) == []


def test_table_created_with_a_key_is_captured_from_its_first_row(pg: TestDatabase,
                                                                 app: App) -> None:
    app.run("CREATE TABLE a (id int PRIMARY KEY)")
    config = CaptureConfig(source_dsn=pg.dsn, schema="public", slot="guard_new")
    Capture(config).setup()
    app.run("BEGIN", "CREATE TABLE b (id int PRIMARY KEY, v text)",
            "INSERT INTO b VALUES (1, 'first, same transaction')", "COMMIT",
            "INSERT INTO b VALUES (2, 'second')", "CREATE TABLE c AS SELECT 1 AS id",
            "ALTER TABLE c ADD PRIMARY KEY (id)", "INSERT INTO c VALUES (2)")
    capture_settled(config)
    assert published(pg.dsn) == ["public.a", "public.b", "public.c"]
    for table in ("public.b", "public.c"):
        assert_stream_equals_table(pg.dsn, table)
    assert not app.warnings or all("public.c" in m for m, _ in app.warnings)


def test_same_transaction_key_change_needs_no_snapshot_unless_rows_changed(
        pg: TestDatabase, app: App) -> None:
    app.run("CREATE TABLE t (id int PRIMARY KEY, k int NOT NULL DEFAULT 0, v text)",
            "INSERT INTO t (id) SELECT generate_series(1, 10)")
    config = CaptureConfig(source_dsn=pg.dsn, schema="public", slot="guard_swap")
    Capture(config).setup()
    capture_settled(config)
    app.run("BEGIN", "ALTER TABLE t DROP CONSTRAINT t_pkey",
            "ALTER TABLE t ADD PRIMARY KEY (id, k)", "COMMIT", "UPDATE t SET v = 'x' WHERE id = 1")
    capture_settled(config)
    with psycopg.connect(pg.dsn) as conn:
        assert len(snapshot_state.runs(conn, "guard_swap", kind="incremental")) == 0
    assert "t" not in [op for *_, op in stream_records(pg.dsn, "public.t")]
    # rows changed while the table had no key (not published): re-read
    app.run("BEGIN", "ALTER TABLE t DROP CONSTRAINT t_pkey", "DELETE FROM t WHERE id = 2",
            "UPDATE t SET v = 'y' WHERE id = 3", "ALTER TABLE t ADD PRIMARY KEY (id)", "COMMIT")
    capture_settled(config)
    with psycopg.connect(pg.dsn) as conn:
        assert len(snapshot_state.runs(conn, "guard_swap", kind="incremental")) == 1
    assert_stream_equals_table(pg.dsn, "public.t")


@pytest.mark.parametrize("ddl, undo, reason", [
    ("ALTER TABLE t DROP CONSTRAINT t_pkey, ADD PRIMARY KEY (id) DEFERRABLE",
     "ALTER TABLE t DROP CONSTRAINT t_pkey, ADD PRIMARY KEY (id)", "DEFERRABLE"),
    ("ALTER TABLE t REPLICA IDENTITY NOTHING", "ALTER TABLE t REPLICA IDENTITY DEFAULT",
     "REPLICA IDENTITY NOTHING"),
    ("CREATE UNIQUE INDEX t_v ON t (v); ALTER TABLE t ALTER v SET NOT NULL; "
     "ALTER TABLE t REPLICA IDENTITY USING INDEX t_v; DROP INDEX t_v",
     "ALTER TABLE t REPLICA IDENTITY DEFAULT", "replica identity index"),
    ("ALTER TABLE t SET UNLOGGED", "ALTER TABLE t SET LOGGED", "UNLOGGED"),
], ids=["deferrable-key", "identity-nothing", "identity-index-dropped", "unlogged"])
def test_identity_changes_never_break_the_application(pg: TestDatabase, app: App, ddl: str,
                                                      undo: str, reason: str) -> None:
    app.run("CREATE TABLE t (id int PRIMARY KEY, v text)",
            "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 10) g")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("t",), slot="guard_identity")
    Capture(config).setup()
    capture_settled(config)
    app.run(*ddl.split("; "))  # SET UNLOGGED itself was refused before the fix
    app.run("UPDATE t SET v = 'changed' WHERE id = 1", "DELETE FROM t WHERE id = 2")
    capture_settled(config)
    assert published(pg.dsn) == []
    (entry,) = slot_health(config).tables_not_captured
    assert reason in entry["reason"] and entry["fix"]
    app.run(*undo.split("; "), "UPDATE t SET v = 'again' WHERE id = 3")
    capture_settled(config)
    assert published(pg.dsn) == ["public.t"]
    assert_stream_equals_table(pg.dsn, "public.t")


def test_partition_without_identity_keeps_its_root_out(pg: TestDatabase, app: App) -> None:
    app.run("CREATE TABLE m (id int, k int, v text, PRIMARY KEY (id, k)) PARTITION BY LIST (k)",
            "CREATE TABLE m1 PARTITION OF m FOR VALUES IN (1)",
            "CREATE TABLE m2 PARTITION OF m FOR VALUES IN (2)",
            "INSERT INTO m SELECT g, 1 + g % 2, 'v' FROM generate_series(1, 10) g")
    config = CaptureConfig(source_dsn=pg.dsn, schema="public", slot="guard_part")
    Capture(config).setup()
    capture_settled(config)
    app.run("ALTER TABLE m2 REPLICA IDENTITY NOTHING",
            "UPDATE m SET v = 'changed'",  # refused (on partition m2) before the fix
            "DELETE FROM m WHERE id = 1")
    assert not_captured(config) == ["public.m"]
    assert "partition public.m2" in slot_health(config).tables_not_captured[0]["reason"]
    app.run("ALTER TABLE m2 REPLICA IDENTITY DEFAULT", "DELETE FROM m WHERE id = 2")
    capture_settled(config)
    assert published(pg.dsn) == ["public.m"]
    assert_stream_equals_table(pg.dsn, "public.m")  # ids are unique across partitions


def test_inheritance_children_are_not_published_with_their_parent(pg: TestDatabase,
                                                                  app: App) -> None:
    app.run("CREATE TABLE par (id int PRIMARY KEY, v text)",
            "CREATE TABLE kid (w int) INHERITS (par)",  # keys are not inherited
            "INSERT INTO kid VALUES (1, 'a', 1)")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("par",), slot="guard_inherit")
    Capture(config).setup()
    assert published(pg.dsn) == ["public.par"]  # ADD TABLE par published kid as well
    app.run("UPDATE kid SET w = 2", "UPDATE par SET v = 'b'", "DELETE FROM kid")


def test_keyless_tables_at_the_start_of_a_schema_capture(pg: TestDatabase, app: App) -> None:
    app.run("CREATE TABLE keyed (id int PRIMARY KEY)", "CREATE TABLE loose (v int)",
            "INSERT INTO keyed VALUES (1)", "INSERT INTO loose VALUES (1)")
    config = CaptureConfig(source_dsn=pg.dsn, schema="public", slot="guard_start")
    Capture(config).setup()  # refused the whole schema before
    assert published(pg.dsn) == ["public.keyed"]
    app.run("UPDATE loose SET v = 2", "DELETE FROM loose")
    capture_settled(config)
    assert not_captured(config) == ["public.loose"]
    assert_stream_equals_table(pg.dsn, "public.keyed")


# -- privileges and clean-up ---------------------------------------------------------------------

def test_without_a_superuser(pg: TestDatabase, replication_role: str) -> None:
    execute(replication_role, "INSERT INTO t SELECT g, 'a' FROM generate_series(1, 5) g")
    with pytest.raises(SourceConfigurationError,
                       match=r"capturing schema 'public' needs a superuser.*--table"):
        Capture(CaptureConfig(source_dsn=replication_role, schema="public",
                              slot="guard_plain")).setup()
    assert published(pg.dsn) == []
    config = CaptureConfig(source_dsn=replication_role, tables=("t",), slot="guard_plain")
    Capture(config).setup()
    health = slot_health(config)
    assert health.publication_guard is False
    assert any("no publication guard" in p for p in health.problems)
    # Without the guard, the table's owner can drop its key while it is published: status
    # says so (critical), and a capture takes it out of the publication (at its start, then
    # every few seconds while it runs).
    execute(replication_role, "ALTER TABLE t DROP CONSTRAINT t_pkey")
    health = slot_health(config)
    assert health.status == "critical"
    assert [t["table"] for t in health.tables_refused] == ["public.t"]
    stop, thread, errors = running_capture(config)
    try:
        wait_for(lambda: published(pg.dsn) == [], "the capture takes t out", timeout=30)
        execute(replication_role, "UPDATE t SET v = 'works'", "DELETE FROM t WHERE id = 1")
        execute(replication_role, "ALTER TABLE t ADD PRIMARY KEY (id)",
                "UPDATE t SET v = 'keyed again' WHERE id = 2")
        wait_for(lambda: published(pg.dsn) == ["public.t"], "the capture adds t again")

        def caught_up() -> bool:
            with ChangelogStore(pg.dsn) as store:
                return replayed_rows(store, "public.t") == source_rows(pg.dsn, "public.t")

        wait_for(caught_up, "the stream of t equals the table")
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not errors, errors


def test_capture_drop_removes_the_guard(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    first = CaptureConfig(source_dsn=pg.dsn, schema="public", slot="guard_a", publication="pa")
    second = CaptureConfig(source_dsn=pg.dsn, tables=("t",), slot="guard_b", publication="pb",
                           stream_prefix="b.")
    Capture(first).setup()
    Capture(second).setup()

    def guard_objects() -> tuple[int, int]:
        with psycopg.connect(pg.dsn) as conn:
            row = conn.execute(
                "SELECT (SELECT count(*) FROM pg_event_trigger), (SELECT count(*) FROM pg_proc p "
                "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'lakefold' "
                "AND p.proname LIKE 'capture\\_%')").fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    assert guard_objects() == (3, 5)
    drop_capture(pg.dsn, pg.dsn, slot="guard_a", publication="pa")
    assert guard_objects() == (3, 5)  # still guarding pb
    execute(pg.dsn, "ALTER TABLE t DROP CONSTRAINT t_pkey", "UPDATE t SET id = 2")
    drop_capture(pg.dsn, pg.dsn, slot="guard_b", publication="pb")
    assert guard_objects() == (0, 0)
    with psycopg.connect(pg.dsn) as conn:
        assert conn.execute("SELECT to_regclass('lakefold.capture_publications')").fetchone() \
            == (None,)


# -- random DDL and DML on a couple of tables ----------------------------------------------------

_TABLES = ("t0", "t1")


@st.composite
def _workloads(draw: st.DrawFn) -> list[tuple[str, ...]]:
    """Steps as (kind, table, ...): valid for the tables' state, so that only lakefold could
    make a statement fail."""
    keyed = dict.fromkeys(_TABLES, True)
    rows: dict[str, list[int]] = {t: [] for t in _TABLES}
    next_id = 1
    steps: list[tuple[str, ...]] = []
    for _ in range(draw(st.integers(3, 18))):
        table = draw(st.sampled_from(_TABLES))
        kind = draw(st.sampled_from(["insert", "insert", "update", "delete", "key", "identity",
                                     "swap", "truncate", "capture"]))
        if kind == "insert":
            count = draw(st.integers(1, 5))
            steps.append(("insert", table, str(next_id), str(count)))
            rows[table] += list(range(next_id, next_id + count))
            next_id += count
        elif kind in ("update", "delete") and rows[table]:
            row = draw(st.sampled_from(rows[table]))
            steps.append((kind, table, str(row)))
            if kind == "delete":
                rows[table].remove(row)
        elif kind == "key":
            steps.append(("drop_key" if keyed[table] else "add_key", table))
            keyed[table] = not keyed[table]
        elif kind == "identity":
            steps.append(("identity", table, draw(st.sampled_from(["FULL", "NOTHING",
                                                                  "DEFAULT"]))))
        elif kind == "swap" and keyed[table]:
            steps.append(("swap", table, draw(st.sampled_from(["", "dml"]))))
        elif kind == "truncate":
            steps.append(("truncate", table))
            rows[table].clear()
        elif kind == "capture":
            steps.append(("capture", table))
    return steps


def _statements(step: tuple[str, ...]) -> list[sql.SQL | sql.Composed]:
    kind, table = step[0], sql.Identifier(step[1])
    key = sql.Identifier(f"{step[1]}_pkey")
    if kind == "insert":
        first, count = int(step[2]), int(step[3])
        return [sql.SQL("INSERT INTO {} (id, v) SELECT g, 'i' || g FROM generate_series({}, {}) "
                        "g").format(table, sql.Literal(first), sql.Literal(first + count - 1))]
    if kind == "update":
        return [sql.SQL("UPDATE {} SET v = v || '+' WHERE id = {}").format(
            table, sql.Literal(int(step[2])))]
    if kind == "delete":
        return [sql.SQL("DELETE FROM {} WHERE id = {}").format(table, sql.Literal(int(step[2])))]
    if kind == "drop_key":
        return [sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(table, key)]
    if kind == "add_key":
        return [sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} PRIMARY KEY (id)").format(table, key)]
    if kind == "identity":
        return [sql.SQL("ALTER TABLE {} REPLICA IDENTITY {}").format(
            table, sql.SQL({"FULL": "FULL", "NOTHING": "NOTHING"}.get(step[2], "DEFAULT")))]
    if kind == "swap":
        dml: list[sql.SQL | sql.Composed] = [
            sql.SQL("UPDATE {} SET v = v || '~'").format(table)] if step[2] else []
        return [sql.SQL("BEGIN"), sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(table, key),
                *dml, sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} PRIMARY KEY (id)").format(
                    table, key), sql.SQL("COMMIT")]
    if kind == "truncate":
        return [sql.SQL("TRUNCATE {}").format(table)]
    return []


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=_workloads())
def test_random_ddl_and_dml_never_fail_and_streams_equal_tables(
        postgres_server: PostgresServer, steps: list[tuple[str, ...]]) -> None:
    name = f"t_{uuid.uuid4().hex[:12]}"
    execute(postgres_server.admin_dsn, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = postgres_server.dsn_for(name)
    try:
        session = App(dsn)
        try:
            for table in _TABLES:
                session.run(sql.SQL("CREATE TABLE {} (id int CONSTRAINT {} PRIMARY KEY, v text)")
                            .format(sql.Identifier(table), sql.Identifier(f"{table}_pkey")),
                            sql.SQL("INSERT INTO {} VALUES (0, 'seed')").format(
                                sql.Identifier(table)))
            config = CaptureConfig(source_dsn=dsn, schema="public", slot="guard_random")
            Capture(config).setup()
            for step in steps:
                if step[0] == "capture":
                    capture_now(config)
                session.run(*_statements(step))  # raises if PostgreSQL refused anything
            with psycopg.connect(dsn) as conn:  # give every table its key and identity back
                for table in _TABLES:
                    has_key = conn.execute("SELECT 1 FROM pg_constraint WHERE conname = %s",
                                           (f"{table}_pkey",)).fetchone()
                    if has_key is None:
                        session.run(*_statements(("add_key", table)))
                    session.run(*_statements(("identity", table, "DEFAULT")))
            capture_settled(config)
            assert published(dsn) == [f"public.{t}" for t in _TABLES]
            for table in _TABLES:
                assert_stream_equals_table(dsn, f"public.{table}")
        finally:
            session.close()
    finally:
        drop_database(postgres_server, name)

