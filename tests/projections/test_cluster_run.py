"""``lakefold run`` on a real Spark standalone cluster, end to end: a master and two workers
from pyspark's ``spark-class`` (loopback, separate work directories), the lake and Spark's
checkpoints on a bucket of a real S3-compatible server (SeaweedFS), the projections of
cluster_projections.py (a fold with Spark-managed state, an append and an SCD2 table over the
event store; a join view and an aggregate view over it, over the captured shop tables).

While it runs, one worker is killed with SIGKILL (its process group: the worker, its executor
and the executor's Python workers) and a new one takes its place; then the driver, the
``lakefold run`` process, is killed with SIGKILL and started again until caught up. Afterwards
each table equals a fresh computation from the event store row for row (the append table has
every event exactly once: nothing lost, nothing twice), and each view equals the same SQL on
the source."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable

from lakefold.capture import CaptureConfig
from lakefold.core.object_store import filesystem_for, storage_options_for
from lakefold.projections.operations import Catalog
from tests.capture.conftest import capture_now
from tests.fixtures.s3 import S3Lake
from tests.fixtures.spark_cluster import ROOT, StandaloneCluster
from tests.projections import helpers
from tests.projections.test_object_store import check_tables_in_the_bucket, events_in_order
from tests.projections.view_shop import change_shop, oracle

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
LAKEFOLD = str(Path(sys.executable).parent / "lakefold")
PROJECTIONS = Path(__file__).with_name("cluster_projections.py")
NAMES = ("revenue", "order_log", "last_amount", "order_lines", "revenue_by_city")


def _run(env: dict[str, str], home: Path, *args: str) -> subprocess.Popen[bytes]:
    """``lakefold run ARGS``, the driver, in a process group of its own."""
    with (home / "run.log").open("ab") as log:
        return subprocess.Popen([LAKEFOLD, "run", *args], cwd=home, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _view(catalog: Catalog, name: str, key: str) -> dict[Any, dict[str, Any]]:
    location = catalog.current(name).location("delta")
    rows = DeltaTable(location, storage_options=storage_options_for(location)).to_pyarrow_table()
    return {row[key]: row for row in rows.to_pylist()}


def _changes(shop: CaptureConfig, rng: random.Random, round_: int) -> None:
    """New order events, and a transaction over the shop's tables, captured."""
    helpers.append_orders(shop.source_dsn, rng, 6, first=12 + 6 * round_)
    change_shop(shop.source_dsn, rng, round_)
    capture_now(shop)


def test_lakefold_run_on_a_standalone_cluster(shop: CaptureConfig, s3_lake: S3Lake,
                                              two_worker_cluster: StandaloneCluster,
                                              tmp_path: Path) -> None:
    cluster, dsn = two_worker_cluster, shop.source_dsn
    rng = random.Random(31)
    helpers.append_orders(dsn, rng, 12)
    home = tmp_path / "home"
    home.mkdir()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LAKEFOLD_")}
    env = clean | s3_lake.environment() | {
        "LAKEFOLD_DSN": dsn, "LAKEFOLD_STORE_DSN": dsn, "LAKEFOLD_HOME": str(home),
        "LAKEFOLD_SPARK_MASTER": cluster.url, "LAKEFOLD_PROJECTIONS": str(PROJECTIONS),
        "LAKEFOLD_SPARK_CONF": json.dumps({"spark.sql.shuffle.partitions": "2"}),
        # the projections module imports the tests' modules (so do the executors: the
        # cluster fixture puts the repository on their Python path)
        "PYTHONPATH": str(ROOT)}
    started = time.monotonic()

    def log(what: str) -> None:
        print(f"{time.monotonic() - started:6.1f} s {what}: batches "
              f"{helpers.committed_batches(catalog, NAMES)}", flush=True)

    with Catalog(dsn) as catalog:
        driver = _run(env, home)
        try:
            assert helpers.wait_for_commits(catalog, NAMES, (-1,) * len(NAMES), timeout=180), \
                (home / "run.log").read_text()[-3000:]
            log("every projection committed")

            # A worker killed while batches run: its executor's tasks are run again elsewhere,
            # and a new worker takes its place.
            before = helpers.committed_batches(catalog, NAMES)
            _changes(shop, rng, 0)
            time.sleep(rng.uniform(0.2, 1.0))
            cluster.kill_worker(1)
            cluster.add_worker()
            assert helpers.wait_for_commits(catalog, NAMES, before, timeout=120), \
                (home / "run.log").read_text()[-3000:]
            log("worker 1 killed, worker 2 added")

            # The driver killed at a random moment, while new changes arrive.
            before = helpers.committed_batches(catalog, NAMES)
            _changes(shop, rng, 1)
            helpers.wait_for_commits(catalog, NAMES, before, timeout=60)
            _changes(shop, rng, 2)
            time.sleep(rng.uniform(0.0, 1.0))
        finally:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
        log("driver killed")

        _changes(shop, rng, 3)
        again = _run(env, home, "--until-caught-up")
        try:
            assert again.wait(timeout=240) == 0, (home / "run.log").read_text()[-3000:]
        finally:
            if again.poll() is None:
                os.killpg(again.pid, signal.SIGKILL)
        log("restarted driver caught up")

        # Every event exactly once in each table, and the fold and SCD2 equal to a fresh
        # computation, all in the bucket with their checkpoints.
        recorded = events_in_order(dsn)
        assert len(recorded) == 12 + 6 * 4
        check_tables_in_the_bucket(catalog, s3_lake, recorded)
        # The views equal the same SQL on the source.
        assert _view(catalog, "order_lines", "order_id") == {
            k[0]: row for k, row in oracle(dsn, "order_lines").items()}
        by_city = _view(catalog, "revenue_by_city", "city")
        for row in by_city.values():
            row["average"] = row["average"].quantize(Decimal("0.000001"))
        assert by_city == {k[0]: row for k, row in oracle(dsn, "revenue_by_city").items()}

    # The fold's state stores, which the executors write through S3A, are in the bucket.
    fs, root = filesystem_for(f"s3://{s3_lake.store.bucket}/lake/_checkpoints/revenue/g1/state")
    assert any(info.type == pafs.FileType.File
               for info in fs.get_file_info(pafs.FileSelector(root, recursive=True)))
    # Nothing of the lake or the checkpoints on the local disk; the executors ran on the
    # workers (each application's directory in a worker's work directory), and the driver
    # lost the killed worker's executor.
    assert not (home / "lake").exists() and not (home / "checkpoints").exists()
    for n in (0, 1, 2):
        assert any(p.name.startswith("app-") for p in cluster.work_dir(n).iterdir()), n
    assert "Lost executor" in (home / "logs" / "spark-driver.log").read_text()
