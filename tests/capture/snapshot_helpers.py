"""Helpers for the snapshot tests: a random writer, and checks that a stream is a valid,
gap-free and duplicate-free history of a table."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import psycopg
from psycopg import sql

from lakefold.capture import ChangelogStore


def seed_table(dsn: str, table: str, rows: int, *, pad: int = 20) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v int NOT NULL, pad text)")
                     .format(sql.Identifier(table)))
        conn.execute(sql.SQL("INSERT INTO {} SELECT g, 0, repeat('x', %s) "
                             "FROM generate_series(1, %s) g").format(sql.Identifier(table)),
                     (pad, rows))


class Writer(threading.Thread):
    """Random inserts, updates, deletes and key changes on ``table`` until stopped."""

    def __init__(self, dsn: str, table: str, *, start_id: int, seed: int,
                 max_id: int | None = None, pause: float = 0.002) -> None:
        super().__init__(daemon=True)
        self.dsn, self.table = dsn, table
        self.next_id = start_id
        self.max_id = max_id or start_id
        self.rng = random.Random(seed)
        self.stop_event = threading.Event()
        self.transactions = 0
        self.pause = pause
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:  # surfaced by stop()
            self.error = e

    def _run(self) -> None:
        ident = sql.Identifier(self.table)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop_event.is_set():
                with conn.transaction():
                    for _ in range(self.rng.randint(1, 8)):
                        action = self.rng.random()
                        target = self.rng.randrange(1, self.next_id)
                        if action < 0.3:
                            conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, 1, 'new')")
                                         .format(ident), (self.next_id,))
                            self.next_id += 1
                        elif action < 0.75:
                            conn.execute(sql.SQL("UPDATE {} SET v = v + 1 WHERE id = %s")
                                         .format(ident), (target,))
                        elif action < 0.93:
                            conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(ident),
                                         (target,))
                        else:
                            conn.execute(sql.SQL(
                                "UPDATE {} SET id = %s WHERE id = %s").format(ident),
                                (self.next_id, target))
                            self.next_id += 1
                self.transactions += 1
                time.sleep(self.rng.random() * self.pause)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(30)
        if self.error is not None:
            raise self.error


def key_histories(store: ChangelogStore, stream: str) -> dict[Any, list[str]]:
    """Per key, the operations of its records in stream order."""
    histories: dict[Any, list[str]] = {}
    position = 1
    while True:
        table = store.read(stream, position, 50_000)
        if table.num_rows == 0:
            return histories
        for op, key in zip(table.column("_op").to_pylist(), table.column("id").to_pylist(),
                           strict=True):
            histories.setdefault(key, []).append(op)
        position = int(table.column("_position")[-1].as_py()) + 1


def assert_valid_histories(histories: dict[Any, list[str]], keys: Any = None, *,
                           existed_before: bool = False) -> None:
    """Each key's records (of ``keys``, default all) form a possible history of a row: a read
    or insert starts it, a read comes only first or restates a live row, no insert follows a
    live row, no update or delete follows a dead one. ``existed_before``: the stream did not
    start with a snapshot, so a key's first record may also be an update or delete."""
    for key, ops in histories.items():
        if keys is not None and key not in keys:
            continue
        alive = existed_before and ops[0] in ("update", "delete")
        for i, op in enumerate(ops):
            if op == "read":
                assert i == 0 or alive, (key, ops)
                alive = True
            elif op == "insert":
                assert not alive, (key, ops)
                alive = True
            elif op == "update":
                assert alive, (key, ops)
            elif op == "delete":
                assert alive, (key, ops)
                alive = False
