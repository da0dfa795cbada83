"""Bad input: each case gives a clear error saying what to do, and nothing is written
half-way (no publication, no slot, no store schema left behind)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from lakefold.capture import (
    Capture,
    CaptureConfig,
    CaptureConfigurationError,
    OwnershipError,
    SlotError,
    SourceConfigurationError,
    StoreError,
)
from lakefold.capture.decoding._replication_connection import ReplicationConnection
from lakefold.local import LocalPostgres
from tests.capture.conftest import execute
from tests.fixtures.postgres import TestDatabase

pytestmark = pytest.mark.timeout(60)


def leftovers(dsn: str) -> tuple[list[str], list[str], bool]:
    """(publications, slots of this database, whether schema lakefold exists)."""
    with psycopg.connect(dsn) as conn:
        publications = [r[0] for r in conn.execute("SELECT pubname FROM pg_publication")]
        slots = [r[0] for r in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE database = current_database()")]
        schema = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'lakefold')").fetchone()
    return publications, slots, bool(schema and schema[0])


def assert_nothing_created(dsn: str, *, publications: tuple[str, ...] = (),
                           slots: tuple[str, ...] = ()) -> None:
    assert leftovers(dsn) == (list(publications), list(slots), False)


def test_wal_level_not_logical() -> None:
    with LocalPostgres(durable=False, settings={"wal_level": "replica"}) as server:
        server.start()
        execute(server.dsn(), "CREATE TABLE t (id int PRIMARY KEY)")
        with pytest.raises(SourceConfigurationError,
                           match=r"wal_level is 'replica'.*set wal_level = logical.*restart"):
            Capture(CaptureConfig(source_dsn=server.dsn(), tables=("t",))).setup()
        assert_nothing_created(server.dsn())


@pytest.fixture
def plain_role(pg: TestDatabase) -> Iterator[str]:
    """A DSN for a login role without REPLICATION (owner of table t)."""
    role = f"r_{uuid.uuid4().hex[:8]}"
    execute(pg.dsn, sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)),
            sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(sql.Identifier(pg.name),
                                                              sql.Identifier(role)),
            "CREATE TABLE t (id int PRIMARY KEY)",
            sql.SQL("ALTER TABLE t OWNER TO {}").format(sql.Identifier(role)))
    params = psycopg.conninfo.conninfo_to_dict(pg.dsn)
    params["user"] = role
    try:
        yield psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]
    finally:
        execute(pg.dsn, "DROP TABLE t")
        execute(pg.server.admin_dsn,
                sql.SQL("REVOKE ALL ON DATABASE {} FROM {}").format(sql.Identifier(pg.name),
                                                                    sql.Identifier(role)),
                sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_missing_replication_privilege(pg: TestDatabase, plain_role: str) -> None:
    with pytest.raises(SourceConfigurationError,
                       match=r"lacks the REPLICATION attribute.*ALTER ROLE r_\w+ REPLICATION"):
        Capture(CaptureConfig(source_dsn=plain_role, tables=("t",))).setup()
    assert_nothing_created(pg.dsn)


def test_table_without_primary_key_or_identity(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE keyed (id int PRIMARY KEY)", "CREATE TABLE loose (v int)",
            "CREATE TABLE deferred (id int PRIMARY KEY DEFERRABLE)")
    # (a schema capture leaves such tables out instead: test_publication_guard)
    with pytest.raises(SourceConfigurationError,
                       match=r"public\.loose have no primary key.*add a primary key"):
        Capture(CaptureConfig(source_dsn=pg.dsn, tables=("keyed", "public.loose"))).setup()
    # PostgreSQL cannot use a DEFERRABLE primary key as replica identity
    with pytest.raises(SourceConfigurationError, match=r"public\.deferred: .*DEFERRABLE"):
        Capture(CaptureConfig(source_dsn=pg.dsn, tables=("deferred",))).setup()
    with pytest.raises(SourceConfigurationError, match="does not exist"):
        Capture(CaptureConfig(source_dsn=pg.dsn, tables=("missing",))).setup()
    with pytest.raises(SourceConfigurationError, match="lakefold's own store"):
        Capture(CaptureConfig(source_dsn=pg.dsn, schema="lakefold")).setup()
    assert_nothing_created(pg.dsn)
    # a unique index as replica identity is a key too
    execute(pg.dsn, "ALTER TABLE loose ALTER v SET NOT NULL",
            "CREATE UNIQUE INDEX loose_v ON loose (v)",
            "ALTER TABLE loose REPLICA IDENTITY USING INDEX loose_v")
    Capture(CaptureConfig(source_dsn=pg.dsn, tables=("loose",))).setup()


def test_publication_owned_by_something_else(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY)",
            "CREATE PUBLICATION theirs FOR TABLE t")
    with pytest.raises(OwnershipError, match=r"'theirs' already exists and was not created by "
                                             r"lakefold.*Choose another publication name"):
        Capture(CaptureConfig(source_dsn=pg.dsn, tables=("t",), publication="theirs")).setup()
    assert_nothing_created(pg.dsn, publications=("theirs",))


def test_slot_owned_by_something_else(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY)",
            "SELECT pg_create_logical_replication_slot('decoder', 'test_decoding')",
            "SELECT pg_create_logical_replication_slot('alien', 'pgoutput')")
    for slot in ("decoder", "alien"):
        with pytest.raises(OwnershipError, match=f"slot '{slot}' already exists.*this store has "
                                                 "no record of it.*Choose another slot name"):
            Capture(CaptureConfig(source_dsn=pg.dsn, tables=("t",), slot=slot)).setup()
    assert_nothing_created(pg.dsn, slots=("decoder", "alien"))


def test_slot_in_use_by_another_program_and_slot_lost(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("t",), slot="busy", max_retries=0)
    Capture(config).setup()
    other = ReplicationConnection(pg.dsn, application_name="someone-else").open()
    try:
        other.start("busy", options={"proto_version": "1", "publication_names": '"lakefold"'})
        with pytest.raises(SlotError, match=r"in use by process \d+ \(application "
                                            r"'someone-else'\).*Stop that program"):
            Capture(config).run(until_lsn=0)
    finally:
        other.close()
    with psycopg.connect(pg.dsn, autocommit=True) as conn:  # its walsender exits
        conn.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                     "WHERE slot_name = 'busy' AND active_pid IS NOT NULL")
        conn.execute("DO $$ BEGIN WHILE EXISTS (SELECT 1 FROM pg_replication_slots WHERE "
                     "slot_name = 'busy' AND active) LOOP PERFORM pg_sleep(0.05); END LOOP; "
                     "END $$")
        conn.execute("SELECT pg_drop_replication_slot('busy')")
    with pytest.raises(SlotError, match=r"no longer exists on the source.*lakefold capture drop"):
        Capture(config).setup()


def test_unreachable_store_and_masked_password(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    store = "host=127.0.0.1 port=1 dbname=x user=u password=hunter2 connect_timeout=2"
    with pytest.raises(StoreError, match=r"cannot connect to the store.*password=\*\*\*.*"
                                         r"check the store DSN") as info:
        Capture(CaptureConfig(source_dsn=pg.dsn, store_dsn=store, tables=("t",))).setup()
    assert "hunter2" not in str(info.value)
    assert_nothing_created(pg.dsn)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"slot": "Bad-Name", "tables": ("t",)}, "slot name 'Bad-Name' is invalid"),
    ({"schema": "public", "tables": ("t",)}, "either a schema"),
    ({}, "either a schema"),
    ({"tables": ("t", "public.t")}, "lists a table twice"),
    ({"tables": ("",)}, "is empty"),
])
def test_invalid_configuration(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises((CaptureConfigurationError, SourceConfigurationError), match=message):
        CaptureConfig(source_dsn="dbname=x", **kwargs)


def test_cli_prints_one_line_and_exits_nonzero(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE loose (v int)")
    cli = Path(sys.executable).parent / "lakefold"
    done = subprocess.run([cli, "capture", "run", "--dsn", pg.dsn, "--table", "loose",
                           "--until-current"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "public.loose have no primary key" in lines[0], done.stderr
    assert_nothing_created(pg.dsn)
