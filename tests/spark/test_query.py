"""SQL over the materialized tables: Spark and the local engine, the catalog, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from lakefold.spark import DeltaTarget, QueryError, UnknownTableError, write_batch
from lakefold.spark._catalog import LakeCatalog, StaticCatalog, TableCatalog, resolve_table
from lakefold.spark._query import Engine, run_query

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    root = tmp_path / "lake"
    write_deltalake(str(root / "orders"), pa.table({
        "id": [1, 2, 3, 4], "customer": [1, 1, 2, 9],
        "amount": [10.0, 5.5, 7.0, None], "region": ["eu", "eu", "us", "us"],
    }), partition_by=["region"])
    write_deltalake(str(root / "customers"), pa.table({"id": [1, 2], "name": ["ann", "bob"]}))
    (root / "_checkpoints").mkdir()
    (root / "not_a_table").mkdir()
    return root


JOIN = ("SELECT c.name, SUM(o.amount) AS total FROM orders o JOIN customers c "
        "ON o.customer = c.id GROUP BY c.name ORDER BY c.name")


def test_lake_catalog_lists_delta_tables_only(lake):
    tables = LakeCatalog(lake).tables()
    assert sorted(tables) == ["customers", "orders"]
    assert isinstance(LakeCatalog(lake), TableCatalog)
    assert LakeCatalog(lake / "missing").tables() == {}
    assert resolve_table(LakeCatalog(lake), "orders") == str(lake / "orders")
    assert resolve_table(LakeCatalog(lake), str(lake / "customers")) == str(lake / "customers")
    with pytest.raises(UnknownTableError, match="known tables: customers, orders"):
        resolve_table(LakeCatalog(lake), "nope")


@pytest.mark.parametrize("engine", [Engine.SPARK, Engine.LOCAL], ids=["spark", "local"])
def test_query_joins_tables_by_name(spark, lake, engine):
    result = run_query(JOIN, LakeCatalog(lake), engine=engine, spark=spark)
    assert result.to_pylist() == [{"name": "ann", "total": 15.5}, {"name": "bob", "total": 7.0}]


def test_query_sees_committed_sink_writes(spark, lake):
    target = DeltaTarget(lake / "revenue", app_id="revenue@1")
    write_batch(spark.createDataFrame([("eu", 15.5)], "region STRING, total DOUBLE"), target, 0)
    catalog = LakeCatalog(lake)
    for engine in Engine:
        result = run_query("SELECT * FROM revenue", catalog, engine=engine, spark=spark)
        assert result.to_pylist() == [{"region": "eu", "total": 15.5}]


def test_unknown_table_lists_the_known_ones(spark, lake):
    with pytest.raises(UnknownTableError) as info:
        run_query("SELECT * FROM nope", LakeCatalog(lake), spark=spark)
    assert "`nope`" in str(info.value) and "known tables: customers, orders" in str(info.value)
    with pytest.raises(QueryError, match="known tables: customers, orders"):
        run_query("SELECT * FROM nope", LakeCatalog(lake), engine=Engine.LOCAL)


def test_bad_sql_gives_spark_message_without_jvm_trace(spark, lake):
    with pytest.raises(QueryError) as info:
        run_query("SELEC name FROM customers", LakeCatalog(lake), spark=spark)
    message = str(info.value)
    assert "PARSE_SYNTAX_ERROR" in message and "'SELEC'" in message
    assert "at org.apache" not in message and "Py4J" not in message
    with pytest.raises(QueryError, match="UNRESOLVED_COLUMN") as info:
        run_query("SELECT zz FROM customers", LakeCatalog(lake), spark=spark)
    assert "at org.apache" not in str(info.value)
    with pytest.raises(QueryError, match="empty"):
        run_query("  ", LakeCatalog(lake), spark=spark)


def test_empty_table_is_queryable(spark, tmp_path):
    target = DeltaTarget(tmp_path / "lake" / "empty", app_id="p@1")
    write_batch(spark.createDataFrame([], "id INT, v STRING"), target, 0)
    catalog = StaticCatalog({"empty": target.path})
    for engine in Engine:
        result = run_query("SELECT count(*) AS n FROM empty", catalog, engine=engine, spark=spark)
        assert result.column(0).to_pylist() == [0]


def _cli(lake: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEFOLD_")}
    env["LAKEFOLD_LAKE_DIR"] = str(lake)
    return subprocess.run(
        [sys.executable, "-c", "from lakefold.cli import main; main()", *args],
        capture_output=True, text=True, env=env, timeout=90, check=False,
    )


def test_cli_local_engine_formats(lake, monkeypatch, capsys):
    from lakefold.cli import main

    monkeypatch.setenv("LAKEFOLD_LAKE_DIR", str(lake))

    def cli(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["lakefold", *args])
        with pytest.raises(SystemExit) as info:
            main()
        captured = capsys.readouterr()
        return int(info.value.code or 0), captured.out, captured.err

    code, out, err = cli("query", JOIN, "--engine", "local", "--format", "json")
    assert code == 0, err
    assert json.loads(out) == [{"name": "ann", "total": 15.5}, {"name": "bob", "total": 7.0}]
    _, out, _ = cli("query", "SELECT id, amount FROM orders ORDER BY id", "-e", "local",
                    "-f", "csv")
    assert out.splitlines() == ["id,amount", "1,10.0", "2,5.5", "3,7.0", "4,"]
    _, out, _ = cli("query", "SELECT name FROM customers ORDER BY name", "-e", "local")
    assert "ann" in out and "(2 rows)" in out
    code, _, err = cli("vacuum", "nope")
    assert code == 1
    assert "unknown table 'nope'; known tables: customers, orders" in " ".join(err.split())
    code, out, _ = cli("optimize", "orders", "--json")
    assert code == 0 and json.loads(out)["path"] == str(lake / "orders")


def test_cli_spark_engine_error_is_one_line_without_jvm_trace(lake):
    out = _cli(lake, "query", "SELEC * FROM orders")
    assert out.returncode == 1
    assert "error: cannot parse the query" in out.stderr and "PARSE_SYNTAX_ERROR" in out.stderr
    assert "at org.apache" not in out.stderr and "Traceback" not in out.stderr
    assert "\tat " not in out.stderr


def test_quieting_pyspark_error_logs_leaves_its_errors_intact(spark):
    """The quieted loggers are pyspark's own class: made first by lakefold, pyspark's calls on
    them with its keywords would fail with a TypeError instead of its AnalysisException."""
    from pyspark.errors import AnalysisException

    from lakefold.spark._query import no_duplicate_error_logs

    with no_duplicate_error_logs():
        pass
    frame = spark.createDataFrame([(1,)], "a int")
    with pytest.raises(AnalysisException, match="no_such_column"):
        frame.select("no_such_column")
    with no_duplicate_error_logs(), pytest.raises(AnalysisException, match="no_such_column"):
        frame.select("no_such_column")
