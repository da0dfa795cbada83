"""A Delta table that delta-spark writes, read as a projection input (``delta_changes``, issue
39): delta-spark (another driver, ``delta_spark_peer``) creates the table and changes it with
INSERT, UPDATE, DELETE, MERGE and OPTIMIZE in several commits; lakefold's projections (a
transform into an upsert target, one into an append target, a fold) read it; after each run
their outputs equal what delta-spark itself reads: the table (``spark.read.format("delta")``)
at the version they caught up to, and its change data feed (``readChangeFeed``), row for row.

Also: a run stopped midway and resumed applies every change once; without the change data
feed appends are read and a DELETE stops the projection with one line, after the versions
before it and with nothing of it written; bad inputs are refused in one line.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from lakefold.projections import (
    Fold,
    MissingKeyError,
    ProjectionDefinitionError,
    ProjectionOptions,
    Registry,
    Runner,
    RunnerConfig,
    StatefulChangelogError,
    UnknownSourceError,
    delta_changes,
    delta_table,
    projection,
    view,
)
from lakefold.projections.definitions._api import registering_into
from lakefold.projections.operations import Catalog, SinkRoots, projection_status
from tests.projections.test_delta_spark import Peer, rows

pytestmark = pytest.mark.timeout(600)

COLUMNS = ["id", "name", "qty"]


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peer]:
    driver = Peer(tmp_path_factory.mktemp("delta-input-peer"))
    try:
        yield driver
    finally:
        driver.close()


def table_sql(path: Path) -> str:
    return "delta.`" + str(path).replace("`", "``") + "`"


def create(peer: Peer, path: Path, *, cdf: bool) -> None:
    peer.sql(f"CREATE TABLE {table_sql(path)} (id BIGINT, name STRING, qty BIGINT) USING delta "
             f"TBLPROPERTIES (delta.enableChangeDataFeed = {str(cdf).lower()}, "
             "delta.enableDeletionVectors = false)")


def insert(peer: Peer, path: Path, ids: range, *, tag: str = "v1") -> None:
    values = ", ".join(f"({i}, '{tag}-{i}', {i % 7})" for i in ids)
    peer.sql(f"INSERT INTO {table_sql(path)} VALUES {values}")


def registry_for(path: Path, *, fold: bool = True, max_records: int = 20_000) -> Registry:
    """Three projections of the table: its latest row per key (upsert), every change
    (append), and a fold that keeps the latest row per key and counts its updates."""
    options = ProjectionOptions(trigger_seconds=0.1, retries=1, backoff_seconds=0.01,
                                max_records_per_batch=max_records)
    registry = Registry()
    with registering_into(registry):
        source = delta_changes(str(path), key=["id"], alias="items")

        @projection("latest_items", sources=[source], target=delta_table("upsert", keys=["id"]),
                    options=options)
        def latest_items(items: Any) -> Any:
            return items.select(*COLUMNS, "_position", "_deleted")

        @projection("item_changes", sources=[source], target=delta_table("append"),
                    options=options)
        def item_changes(items: Any) -> Any:
            return items.select(*COLUMNS, "_type", "_commit_version", "_position")

        if fold:
            folded = Fold("item_fold", sources=[source], key="id",
                          schema="id bigint, name string, qty bigint, updates bigint",
                          target=delta_table("upsert", keys=["id"]), options=options)

            @folded.on("insert", "update")
            def put(state: dict[str, Any], record: Any) -> dict[str, Any]:
                updates = state.get("updates", 0) + (record.type == "update")
                return {**state, "name": record.data["name"], "qty": record.data["qty"],
                        "updates": updates}

            @folded.on("delete")
            def gone(state: dict[str, Any], record: Any) -> None:
                return None
    return registry


def output(catalog: Catalog, name: str, columns: list[str] = COLUMNS) -> pa.Table:
    table = pa.table(DeltaTable(catalog.current(name).location("delta")).to_pyarrow_table())
    return table.select(columns)


def source_at(peer: Peer, path: Path, version: int) -> pa.Table:
    return peer.read(str(path), version).select(COLUMNS)


def feed(peer: Peer, path: Path) -> pa.Table:
    """The change data feed as delta-spark reads it, in the append target's shape."""
    scratch = peer.scratch / f"feed-{time.monotonic_ns()}.parquet"
    peer.ask(op="changes", path=str(path), start=0, out=str(scratch))
    import pyarrow.parquet as pq

    changes = pq.read_table(scratch)
    kinds = {"insert": "insert", "update_postimage": "update", "delete": "delete"}
    kept = [r for r in changes.to_pylist() if r["_change_type"] in kinds]
    return pa.Table.from_pylist([
        {**{c: r[c] for c in COLUMNS}, "_type": kinds[r["_change_type"]],
         "_commit_version": r["_commit_version"]} for r in kept])


def expected_updates(changes: pa.Table) -> dict[int, int]:
    """The fold's update count per live key, from the feed: updates since the key's last
    insert (a delete drops the key's state)."""
    counts: dict[int, int] = {}
    rank = {"delete": 0, "update": 1, "insert": 2}
    for r in sorted(changes.to_pylist(), key=lambda r: (r["_commit_version"], rank[r["_type"]])):
        if r["_type"] == "delete":
            counts.pop(r["id"], None)
        elif r["_type"] == "insert":
            counts[r["id"]] = 0
        else:
            counts[r["id"]] = counts.get(r["id"], 0) + 1
    return counts


def run(spark: Any, registry: Registry, dsn: str, roots: SinkRoots) -> None:
    config = RunnerConfig(store_dsn=dsn, roots=roots, poll_seconds=0.1)
    with Runner(spark, registry, config) as runner:
        runner.run(until_caught_up=True, timeout=300)


def check_round(peer: Peer, path: Path, catalog: Catalog) -> int:
    """Every projection equals delta-spark's reads of the table's newest version and feed."""
    version = DeltaTable(str(path)).version()
    table = source_at(peer, path, version)
    assert rows(output(catalog, "latest_items")) == rows(table)
    assert rows(output(catalog, "item_fold")) == rows(table)
    changes = feed(peer, path)
    appended = output(catalog, "item_changes", [*COLUMNS, "_type", "_commit_version"])
    assert rows(appended) == rows(changes)
    folded = output(catalog, "item_fold", ["id", "updates"]).to_pylist()
    assert {r["id"]: r["updates"] for r in folded} == expected_updates(changes)
    return version


def test_a_projection_follows_a_table_delta_spark_changes(
        spark: Any, peer: Peer, pg: Any, tmp_path: Path) -> None:
    path = tmp_path / "items"
    create(peer, path, cdf=True)
    insert(peer, path, range(0, 30))
    insert(peer, path, range(30, 45))
    roots = SinkRoots.under(tmp_path / "sinks")
    registry = registry_for(path)
    with Catalog(pg.dsn) as catalog:
        run(spark, registry, pg.dsn, roots)
        first = check_round(peer, path, catalog)

        # Updates and deletes: the change data feed's update_postimage and delete rows.
        peer.sql(f"UPDATE {table_sql(path)} SET qty = qty + 100, name = concat(name, '!') "
                 "WHERE id % 3 = 0")
        peer.sql(f"DELETE FROM {table_sql(path)} WHERE id % 5 = 0")
        run(spark, registry, pg.dsn, roots)
        second = check_round(peer, path, catalog)
        assert second == first + 2

        # A MERGE that updates, deletes and inserts in one version, an OPTIMIZE (files
        # rewritten, no data change: read as nothing), then an append after it.
        peer.sql(
            f"MERGE INTO {table_sql(path)} t USING (SELECT id, concat('m-', id) AS name, "
            "id * 2 AS qty FROM range(20, 60)) s ON t.id = s.id "
            "WHEN MATCHED AND s.id % 4 = 0 THEN DELETE "
            "WHEN MATCHED THEN UPDATE SET name = s.name, qty = s.qty "
            "WHEN NOT MATCHED THEN INSERT (id, name, qty) VALUES (s.id, s.name, s.qty)")
        insert(peer, path, range(60, 63), tag="small")
        insert(peer, path, range(63, 66), tag="small")
        optimized = peer.sql(f"OPTIMIZE {table_sql(path)}")
        history = peer.sql(f"DESCRIBE HISTORY {table_sql(path)}")
        assert optimized[0]["metrics"]["numFilesRemoved"] > 1, history
        insert(peer, path, range(100, 105), tag="late")
        run(spark, registry, pg.dsn, roots)
        third = check_round(peer, path, catalog)
        assert third == second + 5
        # The OPTIMIZE version added files but no rows: nothing was appended twice.
        positions = output(catalog, "item_changes", ["_position"]).column(0).to_pylist()
        assert len(positions) == len(set(positions))


def test_a_stopped_run_resumes_with_every_change_once(
        spark: Any, peer: Peer, pg: Any, tmp_path: Path) -> None:
    path = tmp_path / "items"
    create(peer, path, cdf=True)
    for start in range(0, 60, 6):  # ten versions
        insert(peer, path, range(start, start + 6))
    peer.sql(f"UPDATE {table_sql(path)} SET qty = -1 WHERE id < 10")
    roots = SinkRoots.under(tmp_path / "sinks")
    # One version per micro-batch (the record limit is below a version's rows).
    registry = registry_for(path, fold=False, max_records=1)
    config = RunnerConfig(store_dsn=pg.dsn, roots=roots, poll_seconds=0.1)
    stop = threading.Event()
    with Catalog(pg.dsn) as catalog:
        runner = Runner(spark, registry, config)
        thread = threading.Thread(target=runner.run, kwargs={"stop": stop})
        thread.start()
        try:
            deadline = time.monotonic() + 180
            while True:  # stop it after a few versions, midway
                try:
                    done = catalog.current("item_changes").position.get("items", 0)
                except Exception:
                    done = 0
                if done >= (3 + 1) * 2**32:
                    break
                assert time.monotonic() < deadline, "the run did not get going"
                time.sleep(0.05)
        finally:
            stop.set()
            thread.join(timeout=120)
            runner.close()
        partial = output(catalog, "item_changes", ["_commit_version"]).column(0).to_pylist()
        assert 0 < len(set(partial)) < 11  # stopped midway

        insert(peer, path, range(200, 210), tag="after")
        peer.sql(f"DELETE FROM {table_sql(path)} WHERE id >= 205")
        version = DeltaTable(str(path)).version()
        # Status: the input's position and head are table versions, its lag change rows.
        [behind] = projection_status(catalog, pg.dsn, ["item_changes"])[0].sources
        assert behind.head == version and behind.position < version - 1
        assert behind.lag_records >= 10
        run(spark, registry, pg.dsn, roots)
        [caught_up] = projection_status(catalog, pg.dsn, ["item_changes"])[0].sources
        assert (caught_up.position, caught_up.head, caught_up.lag_records) == \
            (version, version, 0)
        changes = feed(peer, path)
        appended = output(catalog, "item_changes", [*COLUMNS, "_type", "_commit_version"])
        assert rows(appended) == rows(changes)  # each change once: none lost, none twice
        assert rows(output(catalog, "latest_items")) == rows(source_at(peer, path, version))


def test_without_the_change_feed_appends_are_read_and_a_delete_stops_it(
        spark: Any, peer: Peer, pg: Any, tmp_path: Path) -> None:
    path = tmp_path / "items"
    create(peer, path, cdf=False)
    insert(peer, path, range(0, 10))
    insert(peer, path, range(10, 20))
    roots = SinkRoots.under(tmp_path / "sinks")
    registry = registry_for(path, fold=False)
    with Catalog(pg.dsn) as catalog:
        run(spark, registry, pg.dsn, roots)
        version = DeltaTable(str(path)).version()
        assert rows(output(catalog, "latest_items")) == rows(source_at(peer, path, version))

        insert(peer, path, range(20, 25))  # read, in the run that stops at the DELETE
        appended = DeltaTable(str(path)).version()
        peer.sql(f"DELETE FROM {table_sql(path)} WHERE id < 5")
        config = RunnerConfig(store_dsn=pg.dsn, roots=roots, poll_seconds=0.1)
        with Runner(spark, registry, config) as runner:
            runner.run(until_caught_up=True, timeout=300)
        for name in ("latest_items", "item_changes"):
            row = catalog.projection(name)
            assert row.state == "failed"
            error = row.last_error or ""
            assert "\n" not in error
            assert f"version {appended + 1} of delta table {path}" in error
            assert "change data feed was off" in error
            assert "SET TBLPROPERTIES (delta.enableChangeDataFeed = true)" in error
            assert f"starting_version={appended + 1}" in error
        # Everything up to the version before the DELETE, nothing of it.
        before = source_at(peer, path, appended)
        assert rows(output(catalog, "latest_items")) == rows(before)
        changes = output(catalog, "item_changes", ["id", "_type"]).to_pylist()
        assert sorted(r["id"] for r in changes) == list(range(25))
        assert {r["_type"] for r in changes} == {"insert"}


def test_bad_inputs_are_refused_in_one_line(
        spark: Any, peer: Peer, pg: Any, tmp_path: Path) -> None:
    path = tmp_path / "items"
    create(peer, path, cdf=True)
    insert(peer, path, range(0, 5))
    config = RunnerConfig(store_dsn=pg.dsn, roots=SinkRoots.under(tmp_path / "sinks"))

    def prepare(source: Any, *, stateful: bool = False) -> None:
        registry = Registry()
        with registering_into(registry):
            @projection("bad", sources=[source], target=delta_table("append"))
            def bad(items: Any) -> Any:
                return items.groupBy("name").count() if stateful else items

        with Runner(spark, registry, config) as runner:
            runner.prepare()

    not_delta = tmp_path / "plain"
    not_delta.mkdir()
    (not_delta / "data.csv").write_text("id\n1\n")
    with pytest.raises(UnknownSourceError, match="is not a Delta table") as refused:
        prepare(delta_changes(str(not_delta), key=["id"]))
    assert "\n" not in str(refused.value)
    with pytest.raises(MissingKeyError, match=r"has no column 'sku'.*\['id', 'name', 'qty'\]"
                       ) as missing:
        prepare(delta_changes(str(path), key=["sku"]))
    assert "\n" not in str(missing.value)
    with pytest.raises(UnknownSourceError, match="newest version is 1; start at a version"):
        prepare(delta_changes(str(path), key=["id"], starting_version=7))
    with pytest.raises(StatefulChangelogError, match="delta table"):
        prepare(delta_changes(str(path), key=["id"]), stateful=True)
    with pytest.raises(ProjectionDefinitionError, match="needs key="):
        delta_changes(str(path), key=[])
    with pytest.raises(ProjectionDefinitionError, match="views do not read Delta inputs"):
        inputs: dict[str, Any] = {"items": delta_changes(str(path), key=["id"])}
        view("v", inputs=inputs, key="id",
             target=delta_table("upsert", keys=["id"]), query="SELECT id FROM items")

    # The schema changes incompatibly (qty becomes text): the run applies the versions
    # before, and stops at the change with one line naming the fix.
    registry = registry_for(path, fold=False)
    run(spark, registry, pg.dsn, config.roots)
    peer.ask(op="write", path=str(path), mode="overwrite", options={"overwriteSchema": "true"},
             query="SELECT CAST(1 AS BIGINT) AS id, 'x' AS name, 'many' AS qty")
    peer.sql(f"INSERT INTO {table_sql(path)} VALUES (2, 'y', 'few')")
    with Runner(spark, registry, RunnerConfig(store_dsn=pg.dsn, roots=config.roots,
                                              poll_seconds=0.1)) as runner:
        runner.run(until_caught_up=True, timeout=300)
    with Catalog(pg.dsn) as catalog:
        error = catalog.projection("item_changes").last_error or ""
        assert catalog.projection("item_changes").state == "failed"
        assert "\n" not in error
        assert "changes column 'qty' from int64 to string" in error
        assert "starting_version=" in error
        assert sorted(output(catalog, "item_changes", ["id"]).column(0).to_pylist()) == \
            list(range(5))


# ----------------------------------------------------------------- the reader alone (delta-rs)


def _changes(source: Any, schema: pa.Schema, start: int = 0) -> list[dict[str, Any]]:
    from lakefold.spark import _source_delta
    from lakefold.spark._source_positions import PositionRange

    end = _source_delta.head(source) + 1
    return [r for batch in _source_delta.read_range(source, PositionRange(start, end), schema)
            for r in batch.to_pylist()]


def test_versions_read_as_changes_in_order_and_optimize_as_nothing(tmp_path: Path) -> None:
    """A table delta-rs writes: each version's rows, at positions that grow with the version,
    deletes before inserts within one (an overwrite); OPTIMIZE reads as nothing."""
    from deltalake import write_deltalake

    from lakefold.spark import _source_delta

    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": [3, 1, 2], "v": ["c", "a", "b"]}),
                    configuration={"delta.enableChangeDataFeed": "true"})
    write_deltalake(path, pa.table({"id": [4], "v": ["d"]}), mode="append")
    DeltaTable(path).update(predicate="id = 2", updates={"v": "'B'"})
    DeltaTable(path).delete("id = 3")
    DeltaTable(path).optimize.compact()
    write_deltalake(path, pa.table({"id": [1, 5], "v": ["x", "y"]}), mode="overwrite")
    source = delta_changes(path, key="id")
    schema = _source_delta.arrow_schema(source)
    seen = [(r["_commit_version"], r["_type"], r["id"], r["v"], r["_deleted"])
            for r in _changes(source, schema)]
    assert seen == [
        (0, "insert", 1, "a", False), (0, "insert", 2, "b", False), (0, "insert", 3, "c", False),
        (1, "insert", 4, "d", False), (2, "update", 2, "B", False), (3, "delete", 3, "c", True),
        (5, "delete", 1, "a", True), (5, "delete", 2, "B", True), (5, "delete", 4, "d", True),
        (5, "insert", 1, "x", False), (5, "insert", 5, "y", False)]
    positions = [r["_position"] for r in _changes(source, schema)]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert {_source_delta.version_at(p) for p in positions} == {0, 1, 2, 3, 5}
    # The versions' rows as the commits count them (the update's pre-image too).
    end = _source_delta.head(source) + 1
    assert _source_delta.batch_rows(source, 0, end) == len(positions) + 1
    # Whole versions per batch: a limit of one row still takes version 0's three.
    assert _source_delta.version_at(_source_delta.batch_end(
        source, 0, _source_delta.head(source) + 1, 1)) == 1
    # From version 2: the table as of version 2, then the versions after it.
    later = delta_changes(path, key="id", starting_version=2)
    tail = [(r["_commit_version"], r["_type"], r["id"]) for r in _changes(later, schema)]
    assert tail[:4] == [(2, "insert", 1), (2, "insert", 2), (2, "insert", 3), (2, "insert", 4)]
    assert tail[4] == (3, "delete", 3)


def test_types_widen_but_do_not_change() -> None:
    from lakefold.spark._source_delta_log import widens

    assert widens(pa.int32(), pa.int64()) and widens(pa.int64(), pa.float64())
    assert widens(pa.decimal128(10, 2), pa.decimal128(12, 2)) and widens(pa.date32(),
                                                                         pa.timestamp("us"))
    assert widens(pa.string_view(), pa.string())
    assert not widens(pa.int64(), pa.int32()) and not widens(pa.int64(), pa.string())
    assert not widens(pa.string(), pa.int64()) and not widens(pa.decimal128(10, 2),
                                                              pa.decimal128(10, 3))


def test_a_partitioned_table_in_a_bucket(spark: Any, pg: Any, s3_lake: Any,
                                         tmp_path: Path) -> None:
    """A Delta table in a bucket of a real S3 server (written by delta-rs, partitioned, change
    data feed on): Spark's workers read it with the object store's options passed along, and
    the projections equal the table's snapshot at the version they caught up to."""
    from deltalake import write_deltalake

    from lakefold.core.object_store import storage_options_for

    uri = f"{s3_lake.uri}/raw/items"
    options = storage_options_for(uri)

    def batch(ids: range, tag: str) -> pa.Table:
        return pa.table({"id": pa.array(list(ids), pa.int64()),
                         "name": [f"{tag}-{i}" for i in ids],
                         "qty": pa.array([i % 7 for i in ids], pa.int64()),
                         "region": ["eu" if i % 2 else "us" for i in ids]})

    write_deltalake(uri, batch(range(0, 20), "v1"), partition_by=["region"],
                    storage_options=options,
                    configuration={"delta.enableChangeDataFeed": "true"})
    write_deltalake(uri, batch(range(20, 30), "v1"), mode="append", storage_options=options)
    registry = registry_for_uri(uri)
    roots = SinkRoots.under(tmp_path / "sinks")
    # The workers get the store's credentials in a source option, which no plan shows.
    from lakefold.spark.internals import range_frame

    frame = range_frame(spark, pg.dsn, delta_changes(uri, key=["id"]), 0, 2**40)
    plans = frame._jdf.queryExecution().toString()
    assert s3_lake.server.secret_access_key not in plans, plans
    with Catalog(pg.dsn) as catalog:
        run(spark, registry, pg.dsn, roots)
        check_snapshot(uri, catalog)
        DeltaTable(uri, storage_options=options).update(
            predicate="id % 3 = 0", updates={"qty": "qty + 100"})
        DeltaTable(uri, storage_options=options).delete("id % 5 = 0")
        DeltaTable(uri, storage_options=options).optimize.compact()
        write_deltalake(uri, batch(range(30, 35), "v2"), mode="append", storage_options=options)
        run(spark, registry, pg.dsn, roots)
        check_snapshot(uri, catalog)
        assert len(output(catalog, "item_changes", ["id"])) == 30 + 10 + 6 + 5
        # A rebuild reads every version again, in Spark's tasks (the partitioned source).
        config = RunnerConfig(store_dsn=pg.dsn, roots=roots, poll_seconds=0.1)
        with Runner(spark, registry, config) as runner:
            runner.request_rebuild("latest_items")
            runner.run(until_caught_up=True, timeout=300)
        assert catalog.current("latest_items").generation == 2
        check_snapshot(uri, catalog)


def registry_for_uri(uri: str) -> Registry:
    registry = Registry()
    with registering_into(registry):
        source = delta_changes(uri, key=["id"], alias="items")

        @projection("latest_items", sources=[source], target=delta_table("upsert", keys=["id"]))
        def latest_items(items: Any) -> Any:
            return items.select(*COLUMNS, "region", "_position", "_deleted")

        @projection("item_changes", sources=[source], target=delta_table("append"))
        def item_changes(items: Any) -> Any:
            return items.select(*COLUMNS, "region", "_type", "_commit_version")
    return registry


def check_snapshot(uri: str, catalog: Catalog) -> None:
    from lakefold.core.object_store import storage_options_for

    table = pa.table(DeltaTable(uri, storage_options=storage_options_for(uri))
                     .to_pyarrow_table()).select([*COLUMNS, "region"])
    assert rows(output(catalog, "latest_items", [*COLUMNS, "region"])) == rows(table)


def test_the_change_feed_turned_on_midway(tmp_path: Path) -> None:
    """Appends before the feed was on, updates and deletes after: all read; the property
    change itself (a new metaData, the same columns) is no change of rows."""
    from deltalake import write_deltalake

    from lakefold.spark import _source_delta

    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}))
    write_deltalake(path, pa.table({"id": [4], "v": ["d"]}), mode="append")
    DeltaTable(path).alter.set_table_properties({"delta.enableChangeDataFeed": "true"})
    DeltaTable(path).delete("id = 2")
    DeltaTable(path).update(predicate="id = 4", updates={"v": "'D'"})
    source = delta_changes(path, key="id")
    seen = [(r["_commit_version"], r["_type"], r["id"], r["v"])
            for r in _changes(source, _source_delta.arrow_schema(source))]
    assert seen == [(0, "insert", 1, "a"), (0, "insert", 2, "b"), (0, "insert", 3, "c"),
                    (1, "insert", 4, "d"), (3, "delete", 2, "b"), (4, "update", 4, "D")]
