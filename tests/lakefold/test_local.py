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
