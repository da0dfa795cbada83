"""Projections with their Delta tables in a bucket of a real S3-compatible server (SeaweedFS),
and Spark's checkpoints in the bucket too (through Hadoop's S3A): a runner with an upsert, an
append and an SCD2 target is killed with SIGKILL while events keep arriving; afterwards each
table equals a fresh computation from the event store, row for row, nothing of the lake or the
checkpoints is on the local disk, and ``lakefold query`` reads the tables from the bucket
through the projection catalog."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable

from lakefold.core.object_store import filesystem_for, storage_options_for
from lakefold.eventstore import EventStore
from lakefold.projections.operations import Catalog
from tests.fixtures.s3 import S3Lake
from tests.projections import helpers

pytestmark = pytest.mark.timeout(900)
KILLS = 3
NAMES = ("revenue", "order_log", "last_amount")
LAKEFOLD = str(Path(sys.executable).parent / "lakefold")


def start_child(dsn: str, redis_url: str, home: Path, mode: str,
                env: dict[str, str]) -> subprocess.Popen[bytes]:
    with (home / "child.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.projections.kill_child", "s3_projections.py", dsn,
             redis_url, str(home), mode],
            stdout=subprocess.PIPE, stderr=log, start_new_session=True,
            env=os.environ | env)


def table_rows(location: str) -> list[dict[str, object]]:
    assert location.startswith("s3://"), location
    found: list[dict[str, object]] = DeltaTable(
        location, storage_options=storage_options_for(location)).to_pyarrow_table().to_pylist()
    return found


def events_in_order(dsn: str) -> list[tuple[int, str, dict[str, str]]]:
    store = EventStore(dsn)
    try:
        return [(int(e.position or 0), e.stream_id, json.loads(e.data_json))
                for e in store.read_all()]
    finally:
        store.close()


def check_tables_in_the_bucket(catalog: Catalog, s3_lake: S3Lake,
                               recorded: list[tuple[int, str, dict[str, str]]]
                               ) -> dict[str, Decimal]:
    """The tables of s3_projections.py and their Spark checkpoints are in the bucket, and each
    table equals a fresh computation from ``recorded`` (the event store's events) row for row;
    returns the revenue per customer."""
    # Every location is in the bucket.
    locations = {name: catalog.current(name).location("delta") for name in NAMES}
    assert all(loc.startswith(f"{s3_lake.uri}/") for loc in locations.values()), locations
    # Spark's checkpoints are in the bucket too (offset and commit logs of every projection).
    checkpoints = {name: catalog.current(name).checkpoint_dir for name in NAMES}
    assert all(c.startswith(f"s3a://{s3_lake.store.bucket}/lake/_checkpoints/{name}/g")
               for name, c in checkpoints.items()), checkpoints
    fs, root = filesystem_for(f"s3://{s3_lake.store.bucket}/lake/_checkpoints")
    objects = [info.path.removeprefix(root + "/") for info in
               fs.get_file_info(pafs.FileSelector(root, recursive=True))
               if info.type == pafs.FileType.File]
    for name in NAMES:
        assert any(o.startswith(f"{name}/g1/commits/") for o in objects), objects
        assert any(o.startswith(f"{name}/g1/offsets/") for o in objects), objects

    # upsert (a fold): one row per customer, the sum of its orders
    revenue: dict[str, Decimal] = defaultdict(Decimal)
    counts: dict[str, int] = defaultdict(int)
    for _, _, data in recorded:
        revenue[data["customer"]] += Decimal(data["amount"])
        counts[data["customer"]] += 1
    assert sorted((r["customer"], r["revenue"], r["orders"])
                  for r in table_rows(locations["revenue"])) == sorted(
        (c, v.quantize(Decimal("0.01")), counts[c]) for c, v in revenue.items())

    # append: every event exactly once, none lost and none twice across the kills
    assert sorted((r["_position"], r["order"], r["customer"], r["amount"])
                  for r in table_rows(locations["order_log"])) == [
        (p, s, d["customer"], d["amount"]) for p, s, d in recorded]

    # SCD2: per customer, one version per change of amount, in order, the last one current
    versions: dict[str, list[str]] = defaultdict(list)
    for _, _, data in recorded:
        if not versions[data["customer"]] or versions[data["customer"]][-1] != data["amount"]:
            versions[data["customer"]].append(data["amount"])
    history: dict[str, list[dict[str, object]]] = defaultdict(list)
    for row in table_rows(locations["last_amount"]):
        history[str(row["customer"])].append(row)
    assert {c: [r["amount"] for r in sorted(rows, key=lambda r: int(str(r["_position"])))]
            for c, rows in history.items()} == dict(versions)
    assert all(sum(bool(r["current"]) for r in rows) == 1 for rows in history.values())

    return revenue


def test_sigkill_loop_with_tables_in_the_bucket(pg, redis_url, s3_lake: S3Lake, tmp_path):
    rng = random.Random(23)
    env = s3_lake.environment()
    helpers.append_orders(pg.dsn, rng, 24)
    with Catalog(pg.dsn) as catalog:
        check_the_bucket_tables(pg, redis_url, s3_lake, tmp_path, rng, env, catalog)


def check_the_bucket_tables(pg, redis_url, s3_lake: S3Lake, tmp_path: Path, rng: random.Random,
                            env: dict[str, str], catalog: Catalog) -> None:
    for kill in range(KILLS):
        before = helpers.committed_batches(catalog, NAMES)
        child = start_child(pg.dsn, redis_url, tmp_path, "run", env)
        helpers.append_orders(pg.dsn, rng, 6, first=24 + 6 * kill)
        helpers.wait_for_commits(catalog, NAMES, before, timeout=120)
        time.sleep(rng.uniform(0.0, 1.0))
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        assert child.stdout is not None
        child.stdout.close()
        print(f"kill {kill}: batches {helpers.committed_batches(catalog, NAMES)}", flush=True)
    child = start_child(pg.dsn, redis_url, tmp_path, "finish", env)
    out, _ = child.communicate(timeout=300)
    assert child.returncode == 0 and b"caught up" in out, (tmp_path / "child.log").read_text()

    recorded = events_in_order(pg.dsn)
    assert len(recorded) == 24 + 6 * KILLS
    # nothing of the lake or of Spark's checkpoints is on the local disk
    assert not (tmp_path / "lake").exists()
    assert not (tmp_path / "checkpoints").exists()
    revenue = check_tables_in_the_bucket(catalog, s3_lake, recorded)

    # `lakefold query` resolves the names through the catalog and reads the bucket.
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LAKEFOLD_")}
    query = subprocess.run(
        [LAKEFOLD, "query", "--engine", "local", "--format", "json",
         "SELECT count(*) AS n, sum(orders) AS orders FROM revenue"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env=clean | env | {"LAKEFOLD_STORE_DSN": pg.dsn})
    assert query.returncode == 0, query.stderr
    assert json.loads(query.stdout) == [{"n": len(revenue), "orders": len(recorded)}]
