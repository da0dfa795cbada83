"""Delta on a real S3-compatible server (SeaweedFS, tests/fixtures/s3.py): the sink's modes,
the readers (Spark, delta-rs, polars, ``lakefold query``), optimize and vacuum, commit safety
between writers, and one clear line for a bad setting."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties, Transaction

from lakefold.core.object_store import (
    ObjectStore,
    ObjectStoreError,
    check_object_store,
    filesystem_for,
    storage_options_for,
    use_object_store,
)
from lakefold.projections.operations import SinkRoots
from lakefold.spark import (
    DeltaTarget,
    Engine,
    LakeCatalog,
    WriteMode,
    optimize_table,
    read_delta,
    run_query,
    vacuum_table,
    write_batch,
)
from lakefold.spark._delta_commit import CommitPolicy, commit_files, open_table
from lakefold.spark._delta_files import FileWriteSpec, file_from_row, write_task_files
from lakefold.spark._delta_schema import plan_write
from lakefold.spark._s3a import HadoopAwsJarsError, hadoop_aws_jars, with_s3a
from tests.fixtures.s3 import S3Lake

pytestmark = pytest.mark.timeout(180)
LAKEFOLD = str(Path(sys.executable).parent / "lakefold")


def table(uri: str) -> DeltaTable:
    return DeltaTable(uri, storage_options=storage_options_for(uri))


def rows(spark, uri: str, order: str = "id") -> list[dict[str, object]]:
    return [r.asDict() for r in read_delta(spark, uri).orderBy(order).collect()]


def test_every_sink_mode_writes_to_the_bucket_and_every_reader_agrees(spark, s3_lake: S3Lake):
    uri = f"{s3_lake.uri}/orders"
    append = DeltaTarget(uri, app_id="orders@1", partition_by=("region",))
    data = [(i, ["eu", "us", "a b/c=d", None][i % 4], f"v{i}") for i in range(40)]
    first = write_batch(spark.createDataFrame(data, "id INT, region STRING, v STRING"), append, 0)
    assert not first.skipped and first.rows_written == 40
    assert write_batch(spark.createDataFrame(data, "id INT, region STRING, v STRING"),
                       append, 0).skipped  # a replayed batch lands once
    expected = [{"id": i, "region": r, "v": v} for i, r, v in data]
    assert rows(spark, uri) == expected  # Spark's workers read the bucket's files
    assert sorted(table(uri).to_pyarrow_table().to_pylist(), key=lambda r: r["id"]) == expected
    assert pl.read_delta(uri, storage_options=storage_options_for(uri)).sort("id").to_dicts() \
        == expected
    # Nothing of it is on a local disk: the objects are in the bucket.
    fs, root = filesystem_for(uri)
    assert fs.get_file_info(f"{root}/_delta_log/00000000000000000000.json").size > 0

    upsert = DeltaTarget(f"{s3_lake.uri}/accounts", mode=WriteMode.UPSERT, app_id="acc@1",
                         keys=("id",), order_by="pos", deleted_column="gone")
    schema = "id INT, pos INT, balance INT, gone BOOLEAN"
    write_batch(spark.createDataFrame([(1, 1, 10, False), (2, 2, 20, False), (3, 3, 30, False)],
                                      schema), upsert, 0)
    write_batch(spark.createDataFrame([(1, 4, 11, False), (1, 5, 12, False), (2, 6, None, True)],
                                      schema), upsert, 1)
    assert [(r["id"], r["balance"]) for r in rows(spark, upsert.path)] == [(1, 12), (3, 30)]

    delete = DeltaTarget(upsert.path, mode=WriteMode.DELETE, app_id="acc-del@1", keys=("id",))
    write_batch(spark.createDataFrame([(3,)], "id INT"), delete, 0)
    assert [r["id"] for r in rows(spark, upsert.path)] == [1]

    overwrite = DeltaTarget(f"{s3_lake.uri}/totals", mode=WriteMode.OVERWRITE, app_id="t@1")
    write_batch(spark.createDataFrame([(1, 5)], "id INT, n INT"), overwrite, 0)
    write_batch(spark.createDataFrame([(2, 7)], "id INT, n INT"), overwrite, 1)
    assert rows(spark, overwrite.path) == [{"id": 2, "n": 7}]

    # The lake's catalog lists the bucket's tables; both query engines read them there.
    catalog = LakeCatalog(s3_lake.uri)
    assert sorted(catalog.tables()) == ["accounts", "orders", "totals"]
    sql = "SELECT region, count(*) AS n FROM orders GROUP BY region"

    def by_region(result: pa.Table) -> list[dict[str, object]]:
        return sorted(result.to_pylist(), key=lambda r: str(r["region"]))

    local = by_region(run_query(sql, catalog, engine=Engine.LOCAL))
    on_spark = by_region(run_query(sql, catalog, engine=Engine.SPARK, spark=spark))
    assert local == on_spark == [{"region": None, "n": 10}, {"region": "a b/c=d", "n": 10},
                                 {"region": "eu", "n": 10}, {"region": "us", "n": 10}]


def test_optimize_and_vacuum_work_on_the_bucket(spark, s3_lake: S3Lake):
    uri = f"{s3_lake.uri}/events"
    target = DeltaTarget(uri, app_id="ev@1")
    for batch in range(4):
        write_batch(spark.createDataFrame([(batch * 10 + i,) for i in range(10)], "id INT"),
                    target, batch)
    before = len(table(uri).file_uris())
    assert before >= 4
    result = optimize_table(uri)
    assert result.files_removed == before and result.files_added == 1
    assert len(table(uri).file_uris()) == 1
    assert [r["id"] for r in rows(spark, uri)] == list(range(40))
    vacuumed = vacuum_table(uri, retention_hours=0, enforce_retention=False)
    assert len([f for f in vacuumed.files if f.endswith(".parquet")]) == before
    assert [r["id"] for r in rows(spark, uri)] == list(range(40))


def test_the_store_refuses_a_commit_from_a_stale_snapshot(s3_lake: S3Lake):
    """The commit safety delta-rs relies on: version N's log file is created only if absent
    (If-None-Match), so a second writer at the same version fails instead of overwriting."""
    uri = f"{s3_lake.uri}/race"
    schema = pa.schema([("id", pa.int64())])
    DeltaTable.create(uri, schema, storage_options=storage_options_for(uri))
    one, two = table(uri), table(uri)  # both at version 0
    one.create_write_transaction([], "append", one.schema())
    # Two blind appends do not conflict: the second finds version 1 taken (the store answered
    # 412), rebases and lands as version 2. A store that ignored If-None-Match would have let
    # it overwrite version 1, and the first commit would be lost.
    two.create_write_transaction([], "append", two.schema())
    assert table(uri).version() == 2 and len(table(uri).history()) == 3
    # The same app transaction from a stale snapshot is a real conflict: refused.
    three, four = table(uri), table(uri)
    batch = CommitProperties(app_transactions=[Transaction("app@1", 0)])
    three.create_write_transaction([], "append", three.schema(), commit_properties=batch)
    with pytest.raises(CommitFailedError):
        four.create_write_transaction([], "append", four.schema(), commit_properties=batch)
    assert table(uri).version() == 3


def _write_batches(store: ObjectStore, uri: str, app_id: str, batches: int, start,
                   attempts) -> None:
    """One writer process: ``batches`` appends of 5 rows each, through lakefold's commit."""
    use_object_store(store)
    schema = pa.schema([("id", pa.int64()), ("writer", pa.string())])
    target = DeltaTarget(uri, app_id=app_id)
    start.wait()
    for batch in range(batches):
        ids = [batch * 5 + i for i in range(5)]
        spec = FileWriteSpec(uri, "", schema, (), storage_options=storage_options_for(uri))
        out = write_task_files(spec, iter([pa.record_batch(
            [pa.array(ids, pa.int64()), pa.array([app_id] * 5)], schema=schema)]))
        files = [file_from_row(r) for b in out for r in b.to_pylist()]
        current = open_table(uri)
        assert current is not None
        plan = plan_write(target, schema, current.schema(), [])
        _, tries, _ = commit_files(current, target, batch, plan, files,
                                   CommitPolicy(attempts=40, first_backoff_s=0.01))
        attempts.put(tries)


def test_two_writer_processes_on_one_table_never_lose_a_commit(s3_lake: S3Lake):
    uri = f"{s3_lake.uri}/shared"
    schema = pa.schema([("id", pa.int64()), ("writer", pa.string())])
    DeltaTable.create(uri, schema, storage_options=storage_options_for(uri))
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(2)
    attempts = context.Queue()
    batches = 12
    writers = [context.Process(target=_write_batches,
                               args=(s3_lake.store, uri, f"w{n}", batches, start, attempts))
               for n in range(2)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(150)
        assert writer.exitcode == 0
    tries = [attempts.get(timeout=5) for _ in range(2 * batches)]
    result = table(uri)
    # Every commit is a version of its own: 1 create + 24 appends, none overwritten.
    assert result.version() == 2 * batches
    assert len(result.history()) == 2 * batches + 1
    data = result.to_pyarrow_table().to_pylist()
    assert len(data) == 2 * batches * 5
    for name in ("w0", "w1"):
        assert sorted(r["id"] for r in data if r["writer"] == name) == list(range(batches * 5))
        assert result.transaction_version(name) == batches - 1
    print(f"commit attempts: {sum(tries)} for {len(tries)} commits")  # races that were retried


def _lakefold(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LAKEFOLD_")}
    return subprocess.run([LAKEFOLD, *args], capture_output=True, text=True, timeout=120,
                          env=clean | env, cwd=cwd)


def test_lakefold_query_reads_the_bucket(spark, s3_lake: S3Lake, tmp_path: Path):
    write_batch(spark.createDataFrame([(1, "a"), (2, "b")], "id INT, v STRING"),
                DeltaTarget(f"{s3_lake.uri}/letters", app_id="l@1"), 0)
    out = _lakefold(["query", "--engine", "local", "--format", "json",
                     "SELECT count(*) AS n FROM letters"], s3_lake.environment(), tmp_path)
    assert out.returncode == 0, out.stderr
    assert '"n": 2' in out.stdout


@pytest.mark.parametrize(("change", "setting"), [
    ({"LAKEFOLD_S3_SECRET_ACCESS_KEY": "not-the-secret"}, "LAKEFOLD_S3_SECRET_ACCESS_KEY"),
    ({"LAKEFOLD_S3_ACCESS_KEY_ID": "LFNOBODY"}, "LAKEFOLD_S3_ACCESS_KEY_ID"),
    ({"LAKEFOLD_S3_BUCKET": "no-such-bucket"}, "LAKEFOLD_S3_BUCKET"),
], ids=["bad-secret", "bad-key", "missing-bucket"])
def test_a_bad_setting_is_one_line_naming_it(s3_lake: S3Lake, tmp_path: Path, change, setting):
    env = s3_lake.environment() | change
    for command in (["query", "--engine", "local", "SELECT 1"], ["optimize", "orders"]):
        out = _lakefold(command, env, tmp_path)
        assert out.returncode == 1
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
        assert setting in lines[0]
        assert "Traceback" not in out.stderr
        for secret in (s3_lake.server.secret_access_key, "not-the-secret"):
            assert secret not in out.stderr + out.stdout


def test_check_object_store_names_the_setting(s3_lake: S3Lake):
    good = s3_lake.store
    check_object_store(good)
    wrong = ObjectStore(bucket=good.bucket, endpoint=good.endpoint,
                        access_key_id=good.access_key_id,
                        secret_access_key=f"{good.secret_access_key}-wrong")
    with pytest.raises(ObjectStoreError, match="LAKEFOLD_S3_SECRET_ACCESS_KEY"):
        check_object_store(wrong)
    missing = ObjectStore(bucket="absent", endpoint=good.endpoint,
                          access_key_id=good.access_key_id,
                          secret_access_key=good.secret_access_key)
    with pytest.raises(ObjectStoreError, match="LAKEFOLD_S3_BUCKET"):
        check_object_store(missing)
    assert good.secret_access_key and good.access_key_id
    assert good.secret_access_key not in repr(good) + good.describe()
    assert good.access_key_id not in repr(good)


def test_spark_reads_every_column_type_from_the_bucket(spark, s3_lake: S3Lake):
    """The workers' pyarrow reader hands Spark the types its own Parquet reader would."""
    uri = f"{s3_lake.uri}/typed"
    frame = spark.sql(
        "SELECT 1 AS id, CAST('2026-11-29 05:00:00' AS TIMESTAMP) AS at, "
        "CAST('2026-11-29 05:00:00' AS TIMESTAMP_NTZ) AS local_at, DATE'2026-11-29' AS day, "
        "CAST(12.34 AS DECIMAL(12,2)) AS amount, 1.5D AS ratio, true AS flag, "
        "X'00FF' AS raw, array(1, 2) AS tags, 'eu' AS region")
    write_batch(frame, DeltaTarget(uri, app_id="typed@1", partition_by=("region",)), 0)
    assert read_delta(spark, uri).collect() == frame.collect()


def test_missing_hadoop_aws_jars_are_one_line_naming_make_peers(pg, s3_lake: S3Lake,
                                                                 tmp_path: Path):
    """With the lake on a bucket, Spark's checkpoints go there through hadoop-aws; without its
    jars, `lakefold run` stops before Spark starts, with one line saying how to get them."""
    projections = Path(__file__).parents[1] / "projections" / "s3_projections.py"
    env = s3_lake.environment() | {"LAKEFOLD_STORE_DSN": pg.dsn,
                                   "LAKEFOLD_HADOOP_AWS_JARS": str(tmp_path / "nowhere")}
    out = _lakefold(["run", "--projections", str(projections), "--until-caught-up"], env,
                    tmp_path)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    assert "hadoop-aws" in lines[0] and "run `make peers`" in lines[0]
    assert "LAKEFOLD_HADOOP_AWS_JARS" in lines[0]
    assert s3_lake.server.secret_access_key not in out.stderr + out.stdout


def test_the_s3a_conf_carries_the_endpoint_but_never_a_credential(s3_lake: S3Lake,
                                                                    tmp_path: Path):
    with pytest.raises(HadoopAwsJarsError, match=r"has no hadoop-aws, bundle jar; run "
                                                 r"`make peers`"):
        hadoop_aws_jars(tmp_path)
    jars = tmp_path / "jars"
    jars.mkdir()
    for name in ("hadoop-aws-3.5.0.jar", "bundle-2.35.4.jar"):
        (jars / name).touch()
    store = s3_lake.store
    conf = with_s3a({"spark.driver.extraClassPath": "/x/postgresql.jar"}, store, jars)
    assert conf["spark.driver.extraClassPath"].split(os.pathsep) == [
        "/x/postgresql.jar", str(jars / "bundle-2.35.4.jar"), str(jars / "hadoop-aws-3.5.0.jar")]
    assert conf["spark.executor.extraClassPath"].split(os.pathsep) == [
        str(jars / "bundle-2.35.4.jar"), str(jars / "hadoop-aws-3.5.0.jar")]
    assert conf["spark.hadoop.fs.s3a.endpoint"] == store.endpoint
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    text = repr(conf)
    assert store.secret_access_key and store.secret_access_key not in text
    assert store.access_key_id and store.access_key_id not in text
    roots = SinkRoots.under(tmp_path, s3_lake.uri)
    assert roots.checkpoint("revenue", 2) == \
        f"s3a://{store.bucket}/lake/_checkpoints/revenue/g2"
