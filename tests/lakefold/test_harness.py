"""The harness gives each test real, isolated services."""

import psycopg
import redis

from tests.fixtures.postgres import TestDatabase


def test_each_test_gets_its_own_logical_database(pg: TestDatabase) -> None:
    with psycopg.connect(pg.dsn) as conn:
        assert conn.execute("SHOW wal_level").fetchone() == ("logical",)
        assert conn.execute("SELECT current_database()").fetchone() == (pg.name,)


def test_redis_is_real_and_empty(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    assert client.dbsize() == 0
    client.set("k", "v")
    assert client.get("k") == b"v"
    client.close()


def test_spark_runs_python_workers(spark) -> None:
    rows = spark.range(100).selectExpr("sum(id) AS s").collect()
    assert rows[0]["s"] == 4950
    assert spark.sparkContext.parallelize(range(10), 2).map(lambda x: x * 2).sum() == 90
