"""delta-spark side by side with delta-rs (issue 39): every kind of Delta table lakefold writes
reads the same through ``spark.read.format("delta")`` in another driver (delta-spark 4.4.0, the
jars ``make peers`` fetches) as through delta-rs and lakefold's own reader, at every version;
delta-spark's OPTIMIZE and VACUUM (RETAIN 1 HOURS: delta-spark rounds to whole hours) run
while lakefold writes, and nothing is lost or doubled;
lakefold reads the tables delta-spark writes, and refuses, in one line, those it cannot.

The delta-spark driver is a child process (``delta_spark_peer``) started the way a user turns
delta-spark on (``LAKEFOLD_DELTA_SPARK=true``); this process keeps lakefold's usual session.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from lakefold.capture import CaptureConfig
from lakefold.projections.definitions._target_specs import delta_table
from lakefold.projections.definitions._targets import TargetContext
from lakefold.projections.exceptions import TargetUnavailableError
from lakefold.projections.operators._view_maintainer import ViewMaintainer
from lakefold.projections.targets._delta import DeltaViewWriter
from lakefold.projections.targets._view_targets import ViewTargetWriter
from lakefold.settings import load_settings
from lakefold.spark import Engine, StaticCatalog, load_snapshot, read_delta, run_query
from lakefold.spark.exceptions import SparkTerminalError
from lakefold.spark.operations import DeltaSparkJarsError, with_delta_spark
from tests.capture.conftest import capture_now, execute
from tests.projections.view_shop import oracle, step_views

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
DAY = 86_400_000_000  # µs
DAY_S = 86_400
#: Each table is compacted this many times by delta-spark while lakefold writes to it.
MIN_OPTIMIZES = 1
MAX_BATCHES = 1_500  # per writer: a bound, should delta-spark's maintenance stall
PAUSE_S = 0.2  # between a writer's batches: a live projection's pace, not a rebuild's


class Peer:
    """The delta-spark driver in its own process, one JSON command at a time."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self._reads = 0
        self.log = (scratch / "peer.log").open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.projections.delta_spark_peer", str(scratch)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
            text=True)
        assert self._answer().get("ready"), "the delta-spark driver did not start"

    def _answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("ANSWER "):
                answer: dict[str, Any] = json.loads(line.removeprefix("ANSWER "))
                return answer
        raise AssertionError(
            f"the delta-spark driver ended; its log: {(self.scratch / 'peer.log').read_text()}")

    def send(self, **command: Any) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def ask(self, **command: Any) -> dict[str, Any]:
        self.send(**command)
        answer = self._answer()
        assert "error" not in answer, answer
        return answer

    def read(self, path: str, version: int | None = None, *, op: str = "read") -> pa.Table:
        """The table as delta-spark reads it (``op="lakefold_read"``: lakefold's
        ``read_delta`` on the delta-spark session)."""
        self._reads += 1
        out = self.scratch / f"read-{self._reads}.parquet"
        self.ask(op=op, path=path, version=version, out=str(out))
        return pq.read_table(out)

    def sql(self, *statements: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.ask(op="sql", statements=list(statements))["rows"]
        return rows

    def close(self) -> None:
        if self.process.poll() is None:
            self.send(op="quit")
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()
        self.log.close()


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peer]:
    driver = Peer(tmp_path_factory.mktemp("delta-spark-peer"))
    try:
        yield driver
    finally:
        driver.close()


def rows(table: pa.Table) -> list[tuple[Any, ...]]:
    """The rows, columns in name order, sorted: the same data compares equal whatever the
    file layout and column order of the reader."""
    names = sorted(table.column_names)
    values = table.select(names).to_pylist()
    return sorted((tuple(r[n] for n in names) for r in values), key=repr)


def same(*tables: pa.Table) -> None:
    first = tables[0]
    for other in tables[1:]:
        assert sorted(other.column_names) == sorted(first.column_names)
        assert rows(other) == rows(first)


def check_every_version(peer: Peer, spark: Any, path: str) -> int:
    """delta-spark reads every version of ``path`` as delta-rs does (time travel), and the
    latest as lakefold's reader does; returns the number of versions."""
    latest = DeltaTable(path).version()
    for version in range(latest + 1):
        same(DeltaTable(path, version=version).to_pyarrow_table(), peer.read(path, version))
    same(DeltaTable(path).to_pyarrow_table(), peer.read(path),
         read_delta(spark, path).toArrow())
    history = peer.sql(f"DESCRIBE HISTORY delta.`{path}`")
    assert sorted(h["version"] for h in history) == list(range(latest + 1))
    return latest + 1


SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.decimal128(10, 2)),
                    ("day", pa.string()), ("_ts", pa.timestamp("us", tz="UTC")),
                    ("_position", pa.int64()), ("_deleted", pa.bool_())])


def batch(rng: random.Random, start: int, count: int, *, keys: int,
          deletes: float = 0.0) -> pa.Table:
    """``count`` changes with positions from ``start``: random keys below ``keys``."""
    items = []
    for position in range(start, start + count):
        key = rng.randrange(keys)
        items.append({"id": key, "name": f"n{position}",
                      "amount": Decimal(rng.randrange(1, 10_000)) / 100,
                      "day": f"2026-11-{1 + key % 3:02d}",
                      "_ts": pa.scalar(1_790_000_000_000_000 + position * DAY // 24,
                                       pa.timestamp("us", tz="UTC")).as_py(),
                      "_position": position, "_deleted": rng.random() < deletes})
    return pa.Table.from_pylist(items, schema=SCHEMA)


def test_every_target_kind_reads_the_same_in_delta_spark(spark: Any, peer: Peer,
                                                         tmp_path: Path) -> None:
    rng = random.Random(39)
    upsert = DeltaViewWriter(delta_table("upsert", keys=["id"]), str(tmp_path / "upsert"),
                             app_id="up@1", name="up")
    append = DeltaViewWriter(delta_table("append", partition_by=["day"]),
                             str(tmp_path / "append"), app_id="ap@1", name="ap")
    scd2 = DeltaViewWriter(delta_table("scd2", keys=["id"]), str(tmp_path / "scd2"),
                           app_id="h@1", name="h")
    position = 1
    for batch_id in range(6):
        changes = batch(rng, position, 40, keys=25, deletes=0.15)
        position += 40
        frame = spark.createDataFrame(changes.drop(["_deleted"]))
        # Both upsert paths: the driver's delta-rs merge (small batches) and the Spark sink.
        if batch_id % 2:
            upsert.write(spark.createDataFrame(changes), batch_id)
        else:
            upsert.write_arrow(changes, batch_id)
        if batch_id % 2:
            append.write(frame, batch_id)  # the Spark sink: tasks write, the driver commits
        else:
            append.append_arrow(changes.drop(["_deleted"]), batch_id)
        scd2.write_scd2(changes, batch_id)
    for writer in (upsert, append, scd2):
        assert check_every_version(peer, spark, writer.path) >= 6
    # The SCD2 history as delta-spark's SQL sees it: one current row per live key.
    current = peer.sql(f"SELECT count(*) AS n FROM delta.`{scd2.path}` WHERE current")
    assert current[0]["n"] == len(DeltaTable(upsert.path).to_pyarrow_table())


def test_a_views_delta_target_reads_the_same_in_delta_spark(
        spark: Any, peer: Peer, shop: CaptureConfig,
        shop_views: dict[str, ViewMaintainer], tmp_path: Path) -> None:
    dsn = shop.source_dsn
    context = TargetContext("views", 1, null_keys=True)
    lines = delta_table("upsert", keys=["order_id"]).open(str(tmp_path / "lines"), context)
    by_city = delta_table("upsert", keys=["city"]).open(str(tmp_path / "by_city"), context)
    writers = [ViewTargetWriter(dsn, shop_views["order_lines"].output.name, lines,
                                reader="lines"),
               ViewTargetWriter(dsn, shop_views["revenue_by_city"].output.name, by_city,
                                reader="by_city")]
    try:
        for change in [None, "UPDATE customers SET city = 'Pune' WHERE id = 3",
                       "DELETE FROM orders WHERE id IN (4, 5)",
                       "UPDATE customers SET city = NULL WHERE id = 1"]:
            if change is not None:
                execute(dsn, change)
                capture_now(shop)
            step_views(shop_views)
            for writer in writers:
                while writer.step(max_records=6) is not None:
                    pass
        for target, name, key in ((lines, "order_lines", "order_id"),
                                  (by_city, "revenue_by_city", "city")):
            check_every_version(peer, spark, target.location)
            held = peer.read(target.location).to_pylist()
            assert sorted((r[key] for r in held), key=repr) == sorted(
                (k[0] for k in oracle(dsn, name)), key=repr)
    finally:
        for writer in writers:
            writer.close()
        for target in (lines, by_city):
            target.close()


def _optimizes(path: str) -> int:
    """OPTIMIZE commits in the table's history."""
    return sum(1 for commit in DeltaTable(path).history()
               if commit.get("operation") == "OPTIMIZE")


def _write_one(writer: DeltaViewWriter, make: Callable[[int], pa.Table],
               written: list[pa.Table], retries: list[str], *, spark: Any = None) -> None:
    """Write the next batch (``make(batch_id)``) as the runner does: a batch whose commit lost
    to another writer (TargetUnavailableError) is written again, exactly once by its batch
    id. Every third append goes through the Spark sink when ``spark`` is given."""
    batch_id = len(written)
    rows_ = make(batch_id)
    while True:
        try:
            if writer.spec.mode == "append":
                if spark is not None and batch_id % 3 == 2:
                    writer.write(spark.createDataFrame(rows_), batch_id)
                else:
                    writer.append_arrow(rows_, batch_id)
            else:
                writer.write_arrow(rows_, batch_id)
            break
        except TargetUnavailableError as e:
            retries.append(str(e))
            time.sleep(0.01)
    written.append(rows_)


def _plant_orphans(table_path: str, *, age_s: float = 8 * DAY_S, count: int = 2) -> list[Path]:
    """Parquet files in the table's directory that no commit references, ``age_s`` old: what a
    batch that crashed before its commit leaves behind, for VACUUM to delete."""
    planted = []
    for _ in range(count):
        orphan = Path(table_path) / f"part-orphan-{random.getrandbits(64):016x}.snappy.parquet"
        pq.write_table(pa.table({"id": [0]}), orphan)
        then = time.time() - age_s
        os.utime(orphan, (then, then))
        planted.append(orphan)
    return planted


def _write_while(stop: threading.Event, writer: DeltaViewWriter,
                 make: Callable[[int], pa.Table], written: list[pa.Table], retries: list[str],
                 *, spark: Any = None) -> None:
    """Write batches until ``stop`` is set (at most MAX_BATCHES)."""
    while not stop.is_set() and len(written) < MAX_BATCHES:
        _write_one(writer, make, written, retries, spark=spark)
        time.sleep(PAUSE_S)


def test_optimize_and_vacuum_while_lakefold_writes(spark: Any, peer: Peer,
                                                   tmp_path: Path) -> None:
    upsert = DeltaViewWriter(delta_table("upsert", keys=["id"]), str(tmp_path / "upsert"),
                             app_id="up@1", name="up")
    append = DeltaViewWriter(delta_table("append"), str(tmp_path / "append"),
                             app_id="ap@1", name="ap")

    def upserts(batch_id: int) -> pa.Table:
        # Keys from a range wide enough that most changes insert: each merge adds a small
        # file (updates rewrite theirs), so OPTIMIZE has files to compact.
        return batch(random.Random(batch_id), 1 + 30 * batch_id, 30, keys=5_000,
                     deletes=0.1)

    def appends(batch_id: int) -> pa.Table:
        return batch(random.Random(-batch_id), 10**6 + 30 * batch_id, 30,
                     keys=10**9).drop(["_deleted"])

    written: dict[str, list[pa.Table]] = {"up": [], "ap": []}
    retries: list[str] = []
    # The tables exist before the maintenance starts.
    _write_one(upsert, upserts, written["up"], retries)
    _write_one(append, appends, written["ap"], retries)
    stop = threading.Event()
    stop_file = tmp_path / "stop"
    # VACUUM RETAIN 1 HOURS: delta-spark rounds RETAIN to whole hours, so 0.2 HOURS is zero,
    # and a zero retention deletes the files a batch wrote but has not committed yet (what
    # three runs of this test once lost; the dry run at the end shows the rounding). What it
    # must delete here: the files of batches that crashed a week ago (delta-spark 4.4.0 keeps
    # untracked files two hours old with RETAIN 1 HOURS; eight days old it deletes them).
    orphans = [*_plant_orphans(upsert.path), *_plant_orphans(append.path)]
    peer.send(op="maintain", paths=[upsert.path, append.path], stop=str(stop_file),
              retain_hours=1)
    # The append writer in a thread of its own: two lakefold writers and the maintenance,
    # until delta-spark has run OPTIMIZE (committed, or lost to a lakefold commit) and
    # VACUUM on each table MIN_OPTIMIZES times, and compacted the append table, while they
    # wrote. (Each step takes seconds here: delta-spark reads a log of hundreds of commits.)
    progress = tmp_path / "stop.progress"

    def enough() -> bool:
        if not progress.exists():
            return False
        tables = json.loads(progress.read_text())["tables"]
        return not any(o.exists() for o in orphans) and \
            _optimizes(append.path) >= MIN_OPTIMIZES and all(
            t["optimized"] + t["conflicts"] >= MIN_OPTIMIZES and t["vacuumed"] >= MIN_OPTIMIZES
            for t in tables.values())

    appender = threading.Thread(target=_write_while, args=(
        stop, append, appends, written["ap"], retries), kwargs={"spark": spark})
    appender.start()
    try:
        while not enough() and len(written["up"]) < MAX_BATCHES:
            for _ in range(10):
                _write_one(upsert, upserts, written["up"], retries)
                time.sleep(PAUSE_S)
    finally:
        stop.set()
        appender.join()
        stop_file.touch()
    maintenance = peer._answer()
    assert "error" not in maintenance, maintenance
    assert enough(), (maintenance, len(written["up"]), len(written["ap"]))
    # What failed was an OPTIMIZE of the upsert table losing to a lakefold merge that
    # rewrote files it was compacting (delta-spark's concurrent-modification errors); the
    # append table's maintenance never fails (appends remove no file).
    assert maintenance["tables"][append.path]["conflicts"] == 0, maintenance
    assert all(c.startswith("optimize: ") for c in maintenance["conflicts"]), maintenance
    # Once lakefold stops writing, delta-spark compacts the upsert table too (into one file;
    # with few merges it may already be one, and OPTIMIZE then commits nothing).
    peer.sql(f"OPTIMIZE delta.`{upsert.path}`")
    assert len(DeltaTable(upsert.path).file_uris()) == 1

    # The oracle: the batches applied in order in Python (latest position per key wins).
    expected: dict[int, dict[str, Any]] = {}
    for rows_ in written["up"]:
        for row in sorted(rows_.to_pylist(), key=lambda r: r["_position"]):
            if row.pop("_deleted"):
                expected.pop(row["id"], None)
            else:
                expected[row["id"]] = row
    want_upsert = pa.Table.from_pylist(list(expected.values()),
                                       schema=SCHEMA.remove(SCHEMA.get_field_index("_deleted")))
    want_append = pa.concat_tables(written["ap"])
    for writer, want, batches in ((upsert, want_upsert, written["up"]),
                                  (append, want_append, written["ap"])):
        same(want, DeltaTable(writer.path).to_pyarrow_table(), peer.read(writer.path),
             read_delta(spark, writer.path).toArrow())
        assert DeltaTable(writer.path).transaction_version(writer.app_id) == len(batches) - 1
    # Nothing doubled: each appended position is there once.
    positions = DeltaTable(append.path).to_pyarrow_table().column("_position").to_pylist()
    assert len(positions) == len(set(positions)) == len(written["ap"]) * 30
    # delta-spark's rounding, the cause of the loss: RETAIN 0.2 HOURS lists a file a minute
    # old (twelve minutes would keep it).
    fresh = _plant_orphans(append.path, age_s=60, count=1)[0]
    listed = peer.sql(f"VACUUM delta.`{append.path}` RETAIN 0.2 HOURS DRY RUN")
    assert any(fresh.name in str(row) for row in listed), listed
    print(f"batches {len(written['up'])} upsert, {len(written['ap'])} append; maintenance "
          f"{maintenance['tables']}, {maintenance['files_removed']} files compacted, "
          f"conflicts {maintenance['conflicts'][:2]}; lakefold retries {len(retries)}")


def test_lakefold_reads_the_tables_delta_spark_writes(spark: Any, peer: Peer,
                                                      tmp_path: Path) -> None:
    path = str(tmp_path / "orders")
    create = (f"CREATE TABLE delta.`{path}` (id BIGINT, customer STRING, "
              "amount DECIMAL(10,2), at TIMESTAMP, day DATE) USING delta PARTITIONED BY (day) "
              "TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    inserts = [f"INSERT INTO delta.`{path}` SELECT id, 'c' || (id % 7), id * 1.25, "
               f"TIMESTAMP '2026-11-01 00:00:00' + make_interval(0, 0, 0, 0, id), "
               f"DATE '2026-11-01' + CAST(id % 3 AS INT) FROM range({i * 50}, {i * 50 + 50})"
               for i in range(12)]  # more than 10 commits: delta-spark writes a checkpoint
    peer.sql(create, *inserts,
             f"UPDATE delta.`{path}` SET amount = amount + 1 WHERE id % 5 = 0",
             f"DELETE FROM delta.`{path}` WHERE id % 11 = 0",
             f"MERGE INTO delta.`{path}` t USING (SELECT id, 'm' AS customer FROM range(590, "
             "620)) s ON t.id = s.id WHEN MATCHED THEN UPDATE SET customer = s.customer "
             "WHEN NOT MATCHED THEN INSERT (id, customer, amount, at, day) VALUES (s.id, "
             "s.customer, 0, NULL, NULL)")
    assert load_snapshot(path).version == 15
    assert any(p.name.endswith(".checkpoint.parquet") for p in (tmp_path / "orders" /
                                                                "_delta_log").iterdir())
    for version in (None, 3, 13):
        same(peer.read(path, version), read_delta(spark, path, version=version).toArrow(),
             DeltaTable(path, version=version).to_pyarrow_table() if version is not None
             else DeltaTable(path).to_pyarrow_table())
    # What `lakefold query` runs, both engines, over the table delta-spark wrote.
    catalog = StaticCatalog({"orders": path})
    sql = "SELECT count(*) AS n, sum(amount) AS total, count(day) AS dated FROM orders"
    want = peer.sql(f"SELECT count(*) AS n, sum(amount) AS total, count(day) AS dated "
                    f"FROM delta.`{path}`")[0]
    for engine in (Engine.SPARK, Engine.LOCAL):
        got = run_query(sql, catalog, engine=engine, spark=spark).to_pylist()[0]
        assert (got["n"], Decimal(str(got["total"])), got["dated"]) == (
            want["n"], Decimal(str(want["total"])), want["dated"]), engine


@pytest.mark.parametrize(("properties", "change", "feature"), [
    ("'delta.enableDeletionVectors' = 'true'", "DELETE FROM {t} WHERE id % 3 = 0",
     "deletionVectors"),
    ("'delta.columnMapping.mode' = 'name'", "ALTER TABLE {t} RENAME COLUMN v TO w",
     "columnMapping"),
], ids=["deletion-vectors", "column-mapping"])
def test_a_feature_lakefolds_reader_lacks_is_refused_or_read_by_delta_spark(
        spark: Any, peer: Peer, tmp_path: Path, properties: str, change: str,
        feature: str) -> None:
    path = str(tmp_path / feature)
    table = f"delta.`{path}`"
    peer.sql(f"CREATE TABLE {table} (id BIGINT, v STRING) USING delta "
             f"TBLPROPERTIES ({properties})",
             f"INSERT INTO {table} SELECT id, 'v' || id FROM range(100)",
             change.format(t=table))
    # Without delta-spark (this process's session): one line naming the feature and the fix.
    with pytest.raises(SparkTerminalError, match=rf"reader feature\(s\) \['{feature}'\] .*"
                                                 r"LAKEFOLD_DELTA_SPARK=true"):
        read_delta(spark, path)
    with pytest.raises(SparkTerminalError, match=feature):
        run_query("SELECT count(*) FROM t", StaticCatalog({"t": path}), spark=spark)
    # With delta-spark (the peer's session): lakefold's reader hands the table to delta-spark.
    same(peer.read(path), peer.read(path, op="lakefold_read"))
    assert peer.read(path).num_rows == (66 if feature == "deletionVectors" else 100)


def test_the_setting_names_the_fix_when_the_jars_are_missing(tmp_path: Path) -> None:
    settings = load_settings(delta_spark=True, delta_spark_jars=tmp_path / "nowhere")
    assert settings.delta_spark
    with pytest.raises(DeltaSparkJarsError, match=r"has no delta-spark_2\.13, delta-storage "
                                                   r"jar; run `make peers`"):
        with_delta_spark({}, settings.delta_spark_jars)
    jars = tmp_path / "jars"
    jars.mkdir()
    for name in ("delta-spark_2.13-4.4.0.jar", "delta-storage-4.4.0.jar"):
        (jars / name).touch()
    conf = with_delta_spark({"spark.jars": "/x/postgresql.jar",
                             "spark.sql.extensions": "my.Extension"}, jars)
    assert conf["spark.jars"].split(",") == [
        "/x/postgresql.jar", str(jars / "delta-spark_2.13-4.4.0.jar"),
        str(jars / "delta-storage-4.4.0.jar")]
    assert conf["spark.sql.extensions"] == "my.Extension,io.delta.sql.DeltaSparkSessionExtension"
    assert conf["spark.sql.catalog.spark_catalog"].endswith("DeltaCatalog")
