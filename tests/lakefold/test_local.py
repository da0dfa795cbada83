"""Throwaway services start, really run, and never outlive their owner."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import psycopg
import pytest
import redis

from lakefold.local import LocalPostgres, LocalRedis


def _servers_under(path: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if any(path in part for part in cmdline):
            found.append(proc)
    return found


@pytest.mark.timeout(60)
def test_postgres_runs_logical_unprivileged_and_reuses_its_data_dir(tmp_path: Path) -> None:
    with LocalPostgres(tmp_path / "pg", durable=False) as server:
        server.start()
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            assert conn.execute("SHOW wal_level").fetchone() == ("logical",)
            assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
            conn.execute("CREATE TABLE kept (id int)")
        pid = server._process.pid if server._process else -1
        if os.geteuid() == 0:
            assert psutil.Process(pid).username() != "root"
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    with LocalPostgres(tmp_path / "pg", durable=False) as again:
        again.start()
        with psycopg.connect(again.dsn()) as conn:
            assert conn.execute("SELECT to_regclass('kept') IS NOT NULL").fetchone() == (True,)


@pytest.mark.timeout(60)
def test_servers_die_with_a_sigkilled_owner(tmp_path: Path) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from pathlib import Path\n"
         "from lakefold.local import LocalPostgres, LocalRedis\n"
         f"pg = LocalPostgres(Path({str(tmp_path)!r}) / 'pg', durable=False).start()\n"
         "r = LocalRedis().start()\n"
         "print(r.port, flush=True)\n"
         "time.sleep(600)\n"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdout is not None
    redis_port = owner.stdout.readline().strip()
    owner.stdout.close()
    assert _servers_under(str(tmp_path)), "postgres should be running"
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        left = _servers_under(str(tmp_path)) + _servers_under(f"127.0.0.1:{redis_port}")
        if not [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"servers outlived their owner: {left}")


@pytest.mark.timeout(30)
@pytest.mark.timeout(120)
def test_s3_takes_writes_to_many_buckets() -> None:
    """Each bucket is a SeaweedFS collection that grows 7 volumes at its first write. With the
    server's defaults its volume count followed the free disk, and on a nearly full disk a
    session's server refused every write after a few buckets (a CI run lost four tests so).
    The count is now fixed (this machine's disk may be too roomy to show the old failure; the
    weed default of 8 volumes would): forty buckets with a file each (280 volumes) take writes."""
    import pyarrow.fs as pafs

    from lakefold.local import LocalS3

    with LocalS3() as server:
        server.start()
        fs = pafs.S3FileSystem(access_key=server.access_key_id,
                               secret_key=server.secret_access_key,
                               endpoint_override=server.endpoint.removeprefix("http://"),
                               scheme="http", region="us-east-1")
        for i in range(40):
            server.create_bucket(f"bucket-{i}")
            with fs.open_output_stream(f"bucket-{i}/file") as out:
                out.write(str(i).encode())
        assert [fs.open_input_stream(f"bucket-{i}/file").read() for i in range(40)] == [
            str(i).encode() for i in range(40)]


def test_redis_answers_and_stops() -> None:
    server = LocalRedis().start()
    client = redis.Redis.from_url(server.url)
    assert client.ping()
    client.close()
    server.stop()
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(server.url, socket_connect_timeout=1).ping()


@pytest.mark.timeout(60)
def test_ctrl_c_stops_servers_and_removes_temporary_data() -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c",
         "import time\n"
         "from lakefold.local import LocalPostgres, LocalRedis\n"
         "with LocalPostgres(durable=False) as pg, LocalRedis() as r:\n"
         "    pg.start(); r.start()\n"
         "    print(pg.data_dir, r.port, flush=True)\n"
         "    time.sleep(600)\n"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert owner.stdout is not None
    data_dir, redis_port = owner.stdout.readline().split()
    owner.stdout.close()
    assert _servers_under(data_dir)
    owner.send_signal(signal.SIGINT)
    assert owner.wait(30) != 0
    assert not [p for p in _servers_under(data_dir) + _servers_under(f"127.0.0.1:{redis_port}")
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not Path(data_dir).exists()
