"""One running system for every console test (package scope): a source database with a
``customers`` table captured by a running ``lakefold capture run``, order events (some of them
poison) in the event store, a running ``lakefold run`` of ``console_projections.py`` (a Redis
cache, a fold that dead-letters the poison, two views), and the console served by uvicorn on
a free loopback port, reading all of it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import uvicorn
from psycopg import sql

from lakefold.console import ConsoleConfig, build_app, install
from lakefold.eventstore import EventStore
from lakefold.local import free_port
from lakefold.projections.operations import SinkRoots
from lakefold.schemas.events import NewEvent
from tests.fixtures.postgres import PostgresServer, drop_database
from tests.fixtures.processes import stop_group

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
LAKEFOLD = str(Path(sys.executable).with_name("lakefold"))
PROJECTIONS = ("customer_cache", "revenue", "customer_cities", "city_counts")
#: The header every action needs (a form or a cross-site request cannot send it).
ACTION = "X-Lakefold-Request"
POISON_EVERY = 5


def wait_until(check: Callable[[], Any], *, what: str, timeout: float = 90.0,
               every: float = 0.2) -> Any:
    """``check()``'s first truthy value; fails naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


class ServedApp:
    """The console of ``config`` served by uvicorn in a thread on a free loopback port; on
    exit its event streams end first (as ``lakefold console`` does), so an open page does
    not hold the shutdown."""

    def __init__(self, config: ConsoleConfig) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.closing = threading.Event()
        app = build_app(config, closing=self.closing)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning", access_log=False,
                                                    timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ServedApp:
        self.thread.start()
        wait_until(lambda: self.server.started, what="the console to listen", timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        self.server.should_exit = True
        self.thread.join(timeout=30)


@dataclass
class System:
    """The running system the console tests share."""

    dsn: str
    redis_url: str
    home: Path
    module: Path
    console: ServedApp
    env: dict[str, str]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    next_customer: int = 100

    @property
    def url(self) -> str:
        return self.console.url

    def client(self, **kwargs: Any) -> httpx.Client:
        """A client of the console that acts as its page does (the action header set)."""
        headers = {ACTION: "test", **kwargs.pop("headers", {})}
        return httpx.Client(base_url=self.url, timeout=30, headers=headers, **kwargs)

    def overview(self) -> dict[str, Any]:
        with self.client() as client:
            response = client.get("/api/overview")
        assert response.status_code == 200, response.text
        return dict(response.json())

    def projection(self, name: str) -> dict[str, Any]:
        return next(p for p in self.overview()["projections"] if p["name"] == name)

    def write_customers(self, count: int) -> None:
        """New customers in the source (the running capture stores them)."""
        with psycopg.connect(self.dsn, autocommit=True) as conn, conn.cursor() as cursor:
            cursor.executemany("INSERT INTO customers VALUES (%s, %s, %s)",
                               [(i, f"name {i}", ("Oslo", "Lima", "Kyiv")[i % 3])
                                for i in range(self.next_customer,
                                               self.next_customer + count)])
        self.next_customer += count

    def lakefold(self, *args: str) -> str:
        """Run the lakefold CLI against the system; its stdout."""
        done = subprocess.run([LAKEFOLD, *args], env=self.env, capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def check_processes(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                log = (self.home / f"{name}.log").read_text(errors="replace")[-3000:]
                raise AssertionError(f"{name} exited ({process.returncode}):\n{log}")


def append_orders(dsn: str, count: int, *, antidote: Path, first: int = 0) -> None:
    """OrderPlaced events; every POISON_EVERY-th one is poison until ``antidote`` exists."""
    store = EventStore(dsn)
    store.install()
    for i in range(first, first + count):
        data: dict[str, Any] = {"customer": f"c{i % 4}", "amount": f"{i + 1}.50"}
        if (i + 1) % POISON_EVERY == 0:
            data["poison"] = str(antidote)
        store.append(f"order-{i}", [NewEvent(type="OrderPlaced", data=data)])
    store.close()


def _start(system: System, name: str, *args: str) -> None:
    with (system.home / f"{name}.log").open("wb") as log:
        system.processes[name] = subprocess.Popen(
            [LAKEFOLD, *args], env=system.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)


@pytest.fixture(scope="package")
def system(postgres_server: PostgresServer, redis_server_url: str,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    home = tmp_path_factory.mktemp("console-system")
    name = f"console_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_server.admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = postgres_server.dsn_for(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE customers (id bigint PRIMARY KEY, name text, city text)")
        conn.execute("INSERT INTO customers SELECT i, 'name ' || i, "
                     "(ARRAY['Oslo', 'Lima', 'Kyiv'])[i % 3 + 1] FROM generate_series(1, 30) i")
    module = home / "console_projections.py"
    shutil.copy(HERE / "console_projections.py", module)
    append_orders(dsn, 20, antidote=home / "antidote")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("LAKEFOLD_")},
           "LAKEFOLD_DSN": dsn, "LAKEFOLD_REDIS_URL": redis_server_url,
           "LAKEFOLD_HOME": str(home), "LAKEFOLD_PROJECTIONS": str(module),
           "LAKEFOLD_SPARK_MASTER": "local[2]", "SPARK_LOCAL_IP": "127.0.0.1"}
    config = ConsoleConfig(store_dsn=dsn, roots=SinkRoots.under(home), redis_url=redis_server_url,
                           projections=str(module), refresh_s=0.5, sample_s=1.0)
    install(config)
    with ServedApp(config) as console:
        system = System(dsn=dsn, redis_url=redis_server_url, home=home, module=module,
                        console=console, env=env)
        try:
            _start(system, "capture", "capture", "run", "--slot", "console",
                   "--publication", "console", "--table", "public.customers")
            _start(system, "runner", "run", "--trigger", "0.3")

            def ready() -> bool:
                system.check_processes()
                overview = system.overview()
                states = {p["name"]: p for p in overview["projections"]}
                return set(PROJECTIONS) <= set(states) and all(
                    states[n]["state"] == "running" and states[n]["lag_records"] == 0
                    for n in PROJECTIONS) and states["revenue"]["dead_letters"] > 0

            wait_until(ready, what="the projections to run and catch up", timeout=240,
                       every=1.0)
            yield system
        finally:
            for process in system.processes.values():
                stop_group(process)
    drop_database(postgres_server, name)


@pytest.fixture(scope="package")
def artifacts() -> Path:
    """Where the browser tests save their screenshots (kept after the run)."""
    folder = REPO / "test-artifacts" / "console"
    folder.mkdir(parents=True, exist_ok=True)
    return folder
