"""Two source databases on two PostgreSQL servers and a store, for the tests of several
sources in one store (capture, listings, views)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql

from lakefold.local import LocalPostgres
from tests.capture.conftest import execute
from tests.fixtures.postgres import PostgresServer, TestDatabase, drop_database

#: B's DSN carries a password, made up per run (the local server trusts loopback, so it is not
#: needed): no listing may show it.
PASSWORD = f"pw-{secrets.token_hex(8)}"


@dataclass(frozen=True)
class TwoSources:
    """Source A (a database of the session's server), source B (a database of the same name
    on a second server, DSN with a password) and a store (another database of A's server)."""

    a: str
    b: str
    store: str
    database: str
    port_a: int
    port_b: int


@pytest.fixture(scope="module")
def second_server() -> Iterator[LocalPostgres]:
    """A second PostgreSQL server, started the project's way (``lakefold.local``)."""
    with LocalPostgres(durable=False) as server:
        server.start()
        yield server


def _two_sources(pg: TestDatabase, store_db: TestDatabase,
                 second_server: LocalPostgres) -> Iterator[TwoSources]:
    """The databases of ``TwoSources``, each with a ``public.orders`` table; B's database is
    dropped (with its slots) afterwards."""
    with psycopg.connect(second_server.dsn(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(pg.name)))
    b = second_server.dsn(pg.name) + f" password={PASSWORD}"
    try:
        for dsn in (pg.dsn, b):
            execute(dsn, "CREATE TABLE orders (id int PRIMARY KEY, amount int NOT NULL)")
        yield TwoSources(a=pg.dsn, b=b, store=store_db.dsn, database=pg.name,
                         port_a=int(psycopg.conninfo.conninfo_to_dict(pg.dsn)["port"] or 0),
                         port_b=second_server.port)
    finally:
        drop_database(PostgresServer(admin_dsn=second_server.dsn()), pg.name)


@pytest.fixture
def sources(pg: TestDatabase, store_db: TestDatabase,
            second_server: LocalPostgres) -> Iterator[TwoSources]:
    yield from _two_sources(pg, store_db, second_server)
