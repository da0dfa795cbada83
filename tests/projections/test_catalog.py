"""The catalog: generations, the atomic switch, retention, pause, batches and dead letters."""

from __future__ import annotations

import threading

import psycopg
import pytest

from lakefold.core import migrations
from lakefold.core.migrations import SchemaMigrationError
from lakefold.projections.exceptions import (
    ProjectionNotFoundError,
    ProjectionStateError,
)
from lakefold.projections.runtime._status import projection_status
from lakefold.projections.state._catalog import COMPONENT, Catalog, SinkRoots
from lakefold.projections.state._deadletters import DeadLetters, NewDeadLetter

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def catalog(pg, tmp_path):
    catalog = Catalog(pg.dsn, SinkRoots.under(tmp_path))
    catalog.install()
    DeadLetters(catalog).install()
    yield catalog
    catalog.close()


def test_install_is_idempotent_and_concurrency_safe(pg, tmp_path):
    errors = []

    def install():
        try:
            c = Catalog(pg.dsn, SinkRoots.under(tmp_path))
            c.install()
            DeadLetters(c).install()
            c.close()
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=install) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_ensure_creates_generation_one_with_private_locations(catalog, tmp_path):
    row = catalog.ensure("revenue", target_kind="delta", fingerprint="f1", keep_generations=1)
    assert row.current_generation == 1 and not row.paused
    gen = catalog.current("revenue")
    assert gen.status == "live"
    assert gen.location("delta") == str((tmp_path / "lake" / "revenue" / "g1").resolve())
    assert gen.location("redis") == "lf:revenue:g1:"
    assert gen.location("search").endswith("search/revenue/g1")
    assert gen.checkpoint_dir.endswith("checkpoints/revenue/g1")
    assert gen.locations == SinkRoots.under(tmp_path).locations("revenue", 1)
    with pytest.raises(ProjectionStateError, match="no location for a kafka target"):
        gen.location("kafka")
    again = catalog.ensure("revenue", target_kind="delta", fingerprint="f2", keep_generations=2)
    assert again.current_generation == 1 and again.fingerprint == "f2"
    assert again.keep_generations == 2


def test_a_new_target_kind_needs_no_catalog_column(pg, tmp_path):
    class WithArchive(SinkRoots):
        def locations(self, name, generation):
            return {**super().locations(name, generation),
                    "archive": f"s3://bucket/{name}/g{generation}"}

    with Catalog(pg.dsn, WithArchive.under(tmp_path)) as catalog:
        catalog.install()
        catalog.ensure("v", target_kind="archive", fingerprint="f", keep_generations=1)
        assert catalog.current("v").location("archive") == "s3://bucket/v/g1"
        assert catalog.begin_rebuild("v").location("archive") == "s3://bucket/v/g2"


def test_a_catalog_with_one_column_per_target_kind_is_migrated(pg, tmp_path):
    """Catalogs written before target kinds were open keep their generations' locations."""
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA lakefold")
        conn.execute("CREATE TABLE lakefold.projections (name text PRIMARY KEY, "
                     "target_kind text NOT NULL, current_generation integer NOT NULL, "
                     "paused boolean NOT NULL DEFAULT false, "
                     "state text NOT NULL DEFAULT 'idle', last_error text, fingerprint text, "
                     "keep_generations integer NOT NULL DEFAULT 1, "
                     "created_at timestamptz NOT NULL DEFAULT now(), "
                     "updated_at timestamptz NOT NULL DEFAULT now())")
        conn.execute("CREATE TABLE lakefold.projection_generations (name text NOT NULL "
                     "REFERENCES lakefold.projections ON DELETE CASCADE, "
                     "generation integer NOT NULL, status text NOT NULL, "
                     "delta_path text NOT NULL, redis_prefix text NOT NULL, "
                     "index_dir text NOT NULL, checkpoint_dir text NOT NULL, scope jsonb, "
                     "position jsonb NOT NULL DEFAULT '{}', batch_id bigint, "
                     "rows_total bigint NOT NULL DEFAULT 0, last_batch_at timestamptz, "
                     "created_at timestamptz NOT NULL DEFAULT now(), switched_at timestamptz, "
                     "PRIMARY KEY (name, generation))")
        conn.execute("INSERT INTO lakefold.projections (name, target_kind, current_generation) "
                     "VALUES ('old', 'delta', 1)")
        conn.execute("INSERT INTO lakefold.projection_generations (name, generation, status, "
                     "delta_path, redis_prefix, index_dir, checkpoint_dir) VALUES "
                     "('old', 1, 'live', '/lake/old/g1', 'lf:old:g1:', '/search/old/g1', "
                     "'/checkpoints/old/g1')")
    with Catalog(pg.dsn, SinkRoots.under(tmp_path)) as catalog:
        catalog.install()
        catalog.install()  # idempotent once migrated
        gen = catalog.current("old")
        assert gen.locations == {"delta": "/lake/old/g1", "redis": "lf:old:g1:",
                                 "search": "/search/old/g1"}
        assert catalog.begin_rebuild("old").locations == SinkRoots.under(tmp_path).locations(
            "old", 2)


def test_rebuild_switch_and_retention(catalog):
    catalog.ensure("v", target_kind="redis", fingerprint="f", keep_generations=1)
    g2 = catalog.begin_rebuild("v")
    assert g2.generation == 2 and g2.status == "building" and g2.location("redis") == "lf:v:g2:"
    with pytest.raises(ProjectionStateError, match="already being rebuilt into generation 2"):
        catalog.begin_rebuild("v")
    assert catalog.current("v").generation == 1  # readers still see generation 1
    assert catalog.switch("v", 2) == []  # generation 1 is kept (keep_generations=1)
    assert catalog.current("v").generation == 2
    g3 = catalog.begin_rebuild("v")
    dropped = catalog.switch("v", g3.generation)
    assert [g.generation for g in dropped] == [1]
    catalog.mark_dropped("v", 1)
    assert [(g.generation, g.status) for g in catalog.generations("v")] == [
        (1, "dropped"), (2, "retired"), (3, "live")]
    with pytest.raises(ProjectionStateError, match="not being built"):
        catalog.switch("v", 2)


def test_abandoned_rebuild_is_droppable(catalog):
    catalog.ensure("v", target_kind="redis", fingerprint="f", keep_generations=3)
    g2 = catalog.begin_rebuild("v")
    catalog.abandon("v", g2.generation)
    assert [g.generation for g in catalog.droppable("v")] == [2]
    assert catalog.building("v") is None
    assert catalog.begin_rebuild("v").generation == 3


def test_switch_is_atomic_for_concurrent_readers(catalog, pg):
    catalog.ensure("v", target_kind="delta", fingerprint="f", keep_generations=5)
    seen = set()
    stop = threading.Event()

    def read():
        reader = Catalog(pg.dsn)
        while not stop.is_set():
            gen = reader.current("v")
            seen.add((gen.generation, gen.status))
        reader.close()

    thread = threading.Thread(target=read)
    thread.start()
    for _ in range(10):
        g = catalog.begin_rebuild("v")
        catalog.switch("v", g.generation)
    stop.set()
    thread.join()
    assert {status for _, status in seen} == {"live"}


def test_unknown_projection_errors(catalog):
    with pytest.raises(ProjectionNotFoundError, match="lakefold run"):
        catalog.current("nope")
    with pytest.raises(ProjectionNotFoundError):
        catalog.set_paused("nope", True)
    with pytest.raises(ProjectionNotFoundError):
        catalog.begin_rebuild("nope")


def test_pause_state_and_batches(catalog):
    catalog.ensure("v", target_kind="delta", fingerprint="f", keep_generations=1)
    assert catalog.set_paused("v", True).paused
    assert not catalog.set_paused("v", False).paused
    catalog.set_state("v", "failed", error="boom")
    row = catalog.projection("v")
    assert (row.state, row.last_error) == ("failed", "boom")
    catalog.record_batch("v", 1, 0, {"orders": 10}, 10)
    catalog.record_batch("v", 1, 1, {"orders": 25}, 15)
    catalog.record_batch("v", 1, 1, {"orders": 25}, 15)  # a replay counts once
    catalog.record_batch("v", 1, 0, {"orders": 10}, 10)  # an older batch never moves back
    gen = catalog.current("v")
    assert gen.position == {"orders": 25} and gen.batch_id == 1 and gen.rows_total == 25
    assert catalog.throughput("v", 1) > 0


def test_errors_are_counted_where_they_happen(catalog, pg):
    """Every time a projection goes retrying or failed with an error counts, the same text
    again too; a state without a new error does not; the count is in the catalog (any process
    reads it, and it outlives the console)."""
    catalog.ensure("v", target_kind="delta", fingerprint="f", keep_generations=1)
    assert catalog.projection("v").errors_total == 0
    for _ in range(12):
        catalog.set_state("v", "retrying", error="TargetUnavailableError: Redis is down")
        catalog.set_state("v", "running", keep_error=True)
    catalog.set_state("v", "retrying")  # no error: nothing to count
    catalog.set_state("v", "stopped", keep_error=True)
    catalog.set_state("v", "running", error=None)
    assert catalog.projection("v").errors_total == 12
    catalog.set_state("v", "failed", error="ValueError: bad row")
    catalog.set_state("v", "failed", keep_error=True)  # the same failure, said again
    with Catalog(pg.dsn) as another:
        (row,) = another.projections()
        assert (row.errors_total, row.last_error) == (13, "ValueError: bad row")
        (status,) = projection_status(another, pg.dsn, ["v"])
        assert status.errors_total == 13 and status.as_json()["errors_total"] == 13


def test_a_catalog_from_before_the_error_count_migrates(pg, tmp_path):
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        assert migrations.migrate(conn, COMPONENT, to=1) == [1]
        conn.execute("INSERT INTO lakefold.projections (name, target_kind, current_generation) "
                     "VALUES ('old', 'delta', 1)")
    with Catalog(pg.dsn, SinkRoots.under(tmp_path)) as catalog:
        # a reader that does not install (`lakefold status`) says what to do
        with pytest.raises(SchemaMigrationError, match=r"errors_total.*`lakefold run`"):
            catalog.projections()
        catalog.install()
        assert catalog.projection("old").errors_total == 0
        catalog.set_state("old", "retrying", error="boom")
        assert catalog.projection("old").errors_total == 1


def test_dead_letters_lifecycle(catalog):
    catalog.ensure("v", target_kind="delta", fingerprint="f", keep_generations=1)
    dlq = DeadLetters(catalog)
    letter = NewDeadLetter(ref="fold:orders:7", stage="fold", source="orders", position=7,
                           record={"id": 7}, error="ZeroDivisionError", attempts=3)
    assert dlq.add("v", 1, [letter]) == 1
    assert dlq.add("v", 1, [letter]) == 0  # a replayed batch records it once
    (entry,) = dlq.find("v")
    assert (entry.status, entry.attempts, entry.record) == ("open", 3, {"id": 7})
    assert dlq.count_open("v") == 1
    (queued,) = dlq.request_retry([entry.id])
    assert queued.status == "retry" and queued.retry_seq is not None
    assert dlq.retry_head("v", 1) == queued.retry_seq
    assert [d.id for d in dlq.pending_retries("v", 1)] == [entry.id]
    # the retry failed again: back to open with more attempts and the new error
    dlq.add("v", 1, [NewDeadLetter(**{**letter.__dict__, "error": "again", "attempts": 3})])
    (entry,) = dlq.find("v")
    assert (entry.status, entry.attempts, entry.error) == ("open", 6, "again")
    dlq.request_retry([entry.id])
    dlq.resolve([entry.id])
    assert dlq.find("v")[0].status == "resolved"
    with pytest.raises(ProjectionStateError, match="resolved, not open"):
        dlq.drop([entry.id])
    with pytest.raises(ProjectionStateError, match="no dead letter with id 999"):
        dlq.request_retry([999])
    with pytest.raises(ProjectionStateError, match="at least one"):
        dlq.drop([])


def test_catalog_outage_is_transient(tmp_path):
    from lakefold.local import free_port
    from lakefold.projections.exceptions import CatalogUnavailableError

    catalog = Catalog(f"host=127.0.0.1 port={free_port()} user=x password=secret dbname=x",
                      SinkRoots.under(tmp_path))
    with pytest.raises(CatalogUnavailableError) as info:
        catalog.install()
    assert info.value.transient and "secret" not in str(info.value)
    assert isinstance(info.value.__cause__, psycopg.OperationalError)
