"""A projection on a real Spark standalone cluster: a master and one worker started from the
pyspark distribution, bound to 127.0.0.1, running the lakefold source and Delta sink."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from deltalake import DeltaTable

from lakefold.eventstore import EventStore
from lakefold.local import free_port
from lakefold.schemas import NewEvent

ROOT = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).parent


def _wait_port(port: int, process: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{log.name} exited: {log.read_text()[-2000:]}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    pytest.fail(f"{log.name} did not listen on {port}: {log.read_text()[-2000:]}")


def _spark_class(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_NO_DAEMONIZE": "1", "PYSPARK_PYTHON": sys.executable}
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args], env=env, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=20)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    """``spark://127.0.0.1:PORT`` of a standalone master with one registered worker."""
    port, ui, worker_ui = free_port(), free_port(), free_port()
    master = _spark_class(
        ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
         "--webui-port", str(ui)], tmp_path / "master.log")
    worker = None
    try:
        _wait_port(port, master, tmp_path / "master.log", 90)
        worker = _spark_class(
            ["org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
             "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
             "--webui-port", str(worker_ui), "--work-dir", str(tmp_path / "work")],
            tmp_path / "worker.log")
        deadline = time.monotonic() + 90
        while "Successfully registered with master" not in (tmp_path / "worker.log").read_text():
            if time.monotonic() > deadline or worker.poll() is not None:
                pytest.fail("worker did not register: "
                            + (tmp_path / "worker.log").read_text()[-2000:])
            time.sleep(0.2)
        # The master, the worker and their web UIs listen on loopback only.
        assert _listening_addresses({master.pid, worker.pid}) == {"127.0.0.1"}
        yield f"spark://127.0.0.1:{port}"
    finally:
        if worker is not None:
            _stop(worker)
        _stop(master)


def _listening_addresses(pids: set[int]) -> set[str]:
    import psutil

    found = set()
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids and conn.laddr:
            found.add(conn.laddr.ip.removeprefix("::ffff:"))
    return found


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_projection_runs_on_a_standalone_cluster(pg, cluster, tmp_path):
    with EventStore(pg.dsn) as store:
        store.install()
        for i in range(600):
            store.append(f"acct-{i % 7}", [NewEvent(type="tick", data={"i": i})])
    lake, checkpoint = tmp_path / "lake", tmp_path / "checkpoint"
    driver = subprocess.run(
        [sys.executable, "-m", "tests.spark.cluster_driver", cluster, pg.dsn, str(lake),
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
    assert (tmp_path / "work").exists() and any((tmp_path / "work").iterdir())  # ran there
