"""A projection on a real Spark standalone cluster: a master and one worker started from the
pyspark distribution, bound to 127.0.0.1, running the lakefold source and Delta sink."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

from lakefold.eventstore import EventStore
from lakefold.schemas import NewEvent
from tests.fixtures.spark_cluster import StandaloneCluster, listening_addresses

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_projection_runs_on_a_standalone_cluster(pg, cluster: StandaloneCluster, tmp_path):
    # The master, the worker and their web UIs listen on loopback only.
    assert cluster.master is not None
    assert listening_addresses({cluster.master.pid, cluster.workers[0].pid}) == {"127.0.0.1"}
    with EventStore(pg.dsn) as store:
        store.install()
        for i in range(600):
            store.append(f"acct-{i % 7}", [NewEvent(type="tick", data={"i": i})])
    lake, checkpoint = tmp_path / "lake", tmp_path / "checkpoint"
    driver = subprocess.run(
        [sys.executable, "-m", "tests.spark.cluster_driver", cluster.url, pg.dsn, str(lake),
         str(checkpoint)],
        cwd=ROOT, capture_output=True, text=True, timeout=200, check=False,
    )
    assert driver.returncode == 0, driver.stderr[-3000:]
    lines = driver.stdout.splitlines()
    assert lines[-1] == "DONE" and lines[0].startswith("APP app-")
    executors = int(next(line for line in lines if line.startswith("EXECUTORS")).split()[1])
    assert executors >= 2  # the driver plus the worker's executor
    totals = {r["stream_id"]: (r["events"], r["last_position"])
              for r in DeltaTable(str(lake / "totals")).to_pyarrow_table().to_pylist()}
    expected = {f"acct-{s}": (sum(1 for i in range(600) if i % 7 == s),
                              max(i + 1 for i in range(600) if i % 7 == s)) for s in range(7)}
    assert totals == expected
    assert DeltaTable(str(lake / "totals")).transaction_version("totals@1") == 2  # 3 batches
    assert any(cluster.work_dir(0).iterdir())  # ran there
