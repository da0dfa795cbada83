"""The store on a PostgreSQL server of its own, end to end through the command line as a
deployment runs it: ``LAKEFOLD_DSN`` names the source (one server), ``LAKEFOLD_STORE_DSN`` the
store (another). ``lakefold capture run`` and ``lakefold run`` keep a join (order_lines) and a
GROUP BY over it (revenue_by_city) equal to the same SQL on the source, first caught up and
then running while the source changes; the runner (its Spark driver and workers included)
never connects to the source's server; every table lakefold keeps is on the store's server,
and the source holds only what capture needs there: its slot, its publication and the
publication guard (``capture.operations._publication_guard``)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
from deltalake import DeltaTable
from psycopg import sql

from lakefold.capture.operations._publication_guard import TRIGGERS
from lakefold.local import LocalPostgres
from lakefold.projections.operations import Catalog
from tests.capture.conftest import execute
from tests.capture.two_sources import second_server
from tests.fixtures.postgres import PostgresServer, TestDatabase, drop_database
from tests.fixtures.processes import stop_group
from tests.projections.view_shop import SHOP_TABLES, change_shop, oracle

__all__ = ["second_server"]  # a fixture, used by name
pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[2]
LAKEFOLD = str(Path(sys.executable).parent / "lakefold")
VIEWS = str(Path(__file__).with_name("view_projections.py"))  # order_lines, revenue_by_city
TABLES = ("public.customers", "public.products", "public.orders")


@pytest.fixture
def store(second_server: LocalPostgres, pg: TestDatabase) -> Iterator[str]:
    """A database on the second server (named like the source's, so only the server tells
    them apart), dropped afterwards."""
    with psycopg.connect(second_server.dsn(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(pg.name)))
    try:
        yield second_server.dsn(pg.name)
    finally:
        drop_database(PostgresServer(admin_dsn=second_server.dsn()), pg.name)


def _port(dsn: str) -> int:
    return int(psycopg.conninfo.conninfo_to_dict(dsn)["port"] or 5432)


def _env(source: str, store: str, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEFOLD_")}
    return env | {
        "LAKEFOLD_DSN": source, "LAKEFOLD_STORE_DSN": store, "LAKEFOLD_HOME": str(home),
        "LAKEFOLD_SPARK_MASTER": "local[2]", "SPARK_LOCAL_IP": "127.0.0.1",
        "LAKEFOLD_CLASS_ARCHIVE": "off",  # no background archive writer outliving the test
        "PYTHONPATH": str(REPO)}  # the views module imports the shop's queries from tests/


def _cli(*args: str, env: dict[str, str]) -> str:
    out = subprocess.run([LAKEFOLD, *args], capture_output=True, text=True, env=env,
                         cwd=env["LAKEFOLD_HOME"], timeout=300, check=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out.stdout


def _start(*args: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([LAKEFOLD, *args], env=env, cwd=env["LAKEFOLD_HOME"],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _tables(store: str) -> dict[str, dict[Any, dict[str, Any]]]:
    """Both views' Delta tables by key, found through the store's catalog ({} before the
    first write)."""
    out: dict[str, dict[Any, dict[str, Any]]] = {}
    with Catalog(store) as catalog:
        for name, key in (("order_lines", "order_id"), ("revenue_by_city", "city")):
            path = catalog.current(name).location("delta")
            rows = DeltaTable(path).to_pyarrow_table().to_pylist() \
                if DeltaTable.is_deltatable(path) else []
            for row in rows:
                if "average" in row:
                    row["average"] = row["average"].quantize(Decimal("0.000001"))
            out[name] = {(row[key],): row for row in rows}
    return out


def _oracle(source: str) -> dict[str, dict[Any, dict[str, Any]]]:
    return {name: oracle(source, name) for name in ("order_lines", "revenue_by_city")}


def _connections(process: subprocess.Popen[bytes], ports: dict[str, int]) -> dict[str, int]:
    """How many TCP connections the process and its children (the Spark driver and its Python
    workers) hold to each server, by name."""
    try:
        family = [psutil.Process(process.pid)]
        family += family[0].children(recursive=True)
    except psutil.NoSuchProcess:
        return dict.fromkeys(ports, 0)
    counts = dict.fromkeys(ports, 0)
    for member in family:
        try:
            connections = member.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        for connection in connections:
            for name, port in ports.items():
                if connection.raddr and connection.raddr.port == port \
                        and connection.status == psutil.CONN_ESTABLISHED:
                    counts[name] += 1
    return counts


def _relations(dsn: str) -> set[str]:
    """The source's or the store's tables, outside PostgreSQL's own schemas."""
    with psycopg.connect(dsn) as conn:
        return {f"{schema}.{name}" for schema, name in conn.execute(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S') "
            "AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')")}


def _what_capture_left(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn) as conn:
        def names(query: str) -> set[str]:
            return {str(row[0]) for row in conn.execute(query)}

        return {
            "slots": names("SELECT slot_name FROM pg_replication_slots "
                           "WHERE database = current_database()"),
            "publications": names("SELECT pubname FROM pg_publication"),
            "event_triggers": names("SELECT evtname FROM pg_event_trigger"),
            "schemas": names("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'lakefold%'"),
            "functions": names("SELECT p.proname FROM pg_proc p JOIN pg_namespace n "
                               "ON n.oid = p.pronamespace WHERE n.nspname LIKE 'lakefold%'"),
        }


def test_the_store_on_a_server_of_its_own_end_to_end(pg: TestDatabase, store: str,
                                                     tmp_path: Path) -> None:
    source = pg.dsn
    assert _port(source) != _port(store)  # two servers
    execute(source, *SHOP_TABLES)
    home = tmp_path / "home"
    home.mkdir()
    env = _env(source, store, home)
    tables = [arg for table in TABLES for arg in ("--table", table)]

    # caught up once: the initial snapshot into the store, both views built from it
    _cli("capture", "run", *tables, "--until-current", env=env)
    _cli("run", "-p", VIEWS, "--until-caught-up", env=env)
    assert _tables(store) == _oracle(source)

    # running as a deployment runs them, while the source changes
    log = tmp_path / "processes.log"
    capture = _start("capture", "run", *tables, env=env, log=log)
    runner = _start("run", "-p", VIEWS, "--trigger", "0.3", env=env, log=log)
    ports = {"source": _port(source), "store": _port(store)}
    seen = {"capture": dict.fromkeys(ports, 0), "runner": dict.fromkeys(ports, 0)}
    try:
        rng = random.Random(11)
        for round_ in range(4):
            change_shop(source, rng, round_)
            time.sleep(0.5)
        deadline = time.monotonic() + 240
        while True:
            for name, process in (("capture", capture), ("runner", runner)):
                assert process.poll() is None, f"{name} ended: {log.read_text()[-3000:]}"
                for server, count in _connections(process, ports).items():
                    seen[name][server] = max(seen[name][server], count)
            if _tables(store) == _oracle(source):
                break
            assert time.monotonic() < deadline, (
                f"the views did not catch up: {log.read_text()[-3000:]}")
            time.sleep(0.5)
    finally:
        stop_group(runner, grace_s=60)
        stop_group(capture, grace_s=60)
    print(f"most connections seen at once, by process and server: {seen}")
    assert seen["runner"]["source"] == 0, seen  # the runner reads the store only
    assert seen["runner"]["store"] >= 1 and seen["capture"]["store"] >= 1, seen
    assert seen["capture"]["source"] >= 1, seen  # its replication connection

    # everything lakefold keeps is on the store's server
    kept = _relations(store)
    for table in ("lakefold.changelog", "lakefold.changelog_streams", "lakefold.capture_slots",
                  "lakefold.projections", "lakefold.projection_generations",
                  "lakefold.stream_states"):
        assert table in kept, (table, sorted(kept))
    with psycopg.connect(store) as conn:
        states = conn.execute("SELECT count(*) FROM lakefold.stream_states").fetchone()
        outputs = conn.execute("SELECT count(*) FROM lakefold.changelog_streams "
                               "WHERE name LIKE 'lakefold_views.%'").fetchone()
    assert states is not None and states[0] >= 4  # order_lines' three inputs, its lines
    assert outputs is not None and outputs[0] == 2  # both views' output streams
    assert any(name.startswith("lakefold_state.") for name in kept)
    assert not {t for t in kept if not t.startswith(("lakefold.", "lakefold_state."))}, kept
    store_side = _what_capture_left(store)
    assert not store_side["slots"] and not store_side["publications"], store_side
    assert not store_side["event_triggers"], store_side

    # and the source holds only what capture needs there
    assert _relations(source) - {f"public.{t}" for t in ("customers", "products", "orders")} \
        <= {"lakefold.capture_publications"}  # the publication guard's scope table
    left = _what_capture_left(source)
    assert len(left["slots"]) == 1 and left["publications"] == {"lakefold"}, left
    assert left["event_triggers"] <= set(TRIGGERS), left
    assert left["schemas"] <= {"lakefold"}, left  # no lakefold_state: no view state here
    assert all(name.startswith("capture_") for name in left["functions"]), left
