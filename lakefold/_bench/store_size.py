"""How big the store gets: the one measure the benches use for lakefold's state in PostgreSQL.

``database_bytes``: ``pg_database_size`` of the store's database (every table, index, TOAST
and free-space file; not the WAL). A bench reads it before and after a step, and the growth is
what that step keeps in the store (nothing lakefold writes is deleted while its inputs are only
appended to). ``schema_bytes`` splits that growth by schema: ``lakefold_state`` holds the
views' state tables (their inputs' latest rows, their own rows, aggregates), ``lakefold`` the
changelog (captured streams and the views' output streams), the event store, the event feeds
and the catalog. A source's own tables are in neither, so a bench whose source database is the
store can subtract them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

STATE_SCHEMA = "lakefold_state"
STORE_SCHEMA = "lakefold"


def database_bytes(dsn: str) -> int:
    """``pg_database_size`` of ``dsn``'s database, in bytes."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    return int(row[0]) if row else 0


def schema_bytes(dsn: str, schemas: Iterable[str]) -> int:
    """The tables of ``schemas`` with their indexes and TOAST (``pg_total_relation_size``)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p', 'm') AND n.nspname = ANY(%s)",
            (list(schemas),)).fetchone()
    return int(row[0]) if row else 0


def state_tables(dsn: str, owner: str) -> dict[str, int]:
    """The state tables ``owner`` (a view's generation, ``view_owner``) keeps, by the stream
    each holds the latest rows of (its inputs, and its own output), with their indexes."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT stream, pg_total_relation_size(format('%%I.%%I', %s::text, table_name)"
            "::regclass) "
            "FROM lakefold.stream_states WHERE owner = %s ORDER BY stream",
            (STATE_SCHEMA, owner)).fetchall()
    return {str(stream): int(size) for stream, size in rows}


@dataclass(frozen=True)
class StoreSize:
    """The store at one moment: the database, the views' state tables (``lakefold_state``)
    and the rest of lakefold's schema (``lakefold``)."""

    database: int
    states: int
    store: int

    @classmethod
    def of(cls, dsn: str) -> StoreSize:
        return cls(database_bytes(dsn), schema_bytes(dsn, [STATE_SCHEMA]),
                   schema_bytes(dsn, [STORE_SCHEMA]))

    def growth_since(self, before: StoreSize) -> dict[str, int]:
        """``store_bytes`` (the database's growth), ``state_table_bytes`` (of it, the views'
        state tables) and ``stream_bytes`` (of it, lakefold's schema: the changelog's streams,
        the views' output streams and feeds, the catalog)."""
        return {"store_bytes": self.database - before.database,
                "state_table_bytes": self.states - before.states,
                "stream_bytes": self.store - before.store}
