"""Several source databases into one store: two captures from two PostgreSQL servers, each
with its own slot and stream prefix, never collide; a second source using a slot or a prefix
another source owns is refused in one line with nothing created; `capture streams`,
`status` and the console list both captures' streams with their sources (never a password)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest

from lakefold.capture import (
    Capture,
    CaptureConfig,
    ChangelogStore,
    OwnershipError,
    slot_name_for,
)
from lakefold.capture.operations._capture import drop_capture
from lakefold.console._overview import StoreAddresses, read_captures
from tests.capture.conftest import capture_now, execute, replayed_rows, source_rows
from tests.capture.two_sources import PASSWORD, TwoSources, second_server, sources

__all__ = ["second_server", "sources"]  # fixtures, used by name

pytestmark = pytest.mark.timeout(180)
CLI = Path(sys.executable).parent / "lakefold"


def _config(dsn: str, store: str, *, slot: str, prefix: str = "") -> CaptureConfig:
    return CaptureConfig(source_dsn=dsn, store_dsn=store, slot=slot, publication="lakefold",
                         tables=("public.orders",), stream_prefix=prefix)


def _nothing_on(dsn: str) -> tuple[list[str], list[str]]:
    """The slots and publications of ``dsn``'s database."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        slots = [r[0] for r in conn.execute("SELECT slot_name FROM pg_replication_slots "
                                            "WHERE database = current_database()")]
        publications = [r[0] for r in conn.execute("SELECT pubname FROM pg_publication")]
    return slots, publications


def _store_rows(store: str) -> tuple[list[tuple[str, str | None]], list[str]]:
    with psycopg.connect(store, autocommit=True) as conn:
        slots = [(str(r[0]), r[1]) for r in conn.execute(
            "SELECT slot_name, stream_prefix FROM lakefold.capture_slots ORDER BY 1")]
        streams = [r[0] for r in conn.execute(
            "SELECT name FROM lakefold.changelog_streams ORDER BY 1")]
    return slots, streams


def _cli(*args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(CLI), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert PASSWORD not in done.stdout + done.stderr
    return done.stdout


def test_two_servers_into_one_store_each_slot_and_prefix_its_own(sources: TwoSources) -> None:
    default_slot = slot_name_for(sources.database)  # the same on both servers
    execute(sources.a, "INSERT INTO orders SELECT g, g FROM generate_series(1, 5) g")
    execute(sources.b, "INSERT INTO orders SELECT g, 100 + g FROM generate_series(1, 3) g")
    capture_now(_config(sources.a, sources.store, slot=default_slot))

    # B with A's slot name: refused in one line, before anything is created
    with pytest.raises(OwnershipError) as refused:
        capture_now(_config(sources.b, sources.store, slot=default_slot, prefix="b."))
    message = str(refused.value)
    assert "\n" not in message and "another source" in message and "--slot" in message
    assert f"127.0.0.1:{sources.port_a}/{sources.database}" in message
    assert PASSWORD not in message
    # B with its own slot but A's prefix (none): both have public.orders
    with pytest.raises(OwnershipError) as refused:
        capture_now(_config(sources.b, sources.store, slot="lakefold_b"))
    message = str(refused.value)
    assert "\n" not in message and "stream prefix '' (none)" in message
    assert f"slot {default_slot!r}" in message and "--stream-prefix" in message
    for _ in range(2):  # nothing half-made on B, nothing new in the store
        assert _nothing_on(sources.b) == ([], [])
        assert _store_rows(sources.store) == ([(default_slot, "")], ["public.orders"])

    # with a slot and a prefix of its own, B captures beside A
    b_config = _config(sources.b, sources.store, slot="lakefold_b", prefix="b.")
    capture_now(b_config)
    execute(sources.a, "UPDATE orders SET amount = -1 WHERE id = 2", "DELETE FROM orders "
            "WHERE id = 5")
    execute(sources.b, "UPDATE orders SET amount = -2 WHERE id = 2",
            "INSERT INTO orders VALUES (9, 9)")
    capture_now(_config(sources.a, sources.store, slot=default_slot))
    capture_now(b_config)
    both = sorted([(default_slot, ""), ("lakefold_b", "b.")])
    assert _store_rows(sources.store) == (both, ["b.public.orders", "public.orders"])
    with ChangelogStore(sources.store) as store:
        assert replayed_rows(store, "public.orders") == source_rows(sources.a, "public.orders")
        assert replayed_rows(store, "b.public.orders") == source_rows(sources.b,
                                                                      "public.orders")
    # a prefix of B's is B's: A cannot take it either
    taken = re.escape("stream prefix 'b.' is used by slot 'lakefold_b'")
    with pytest.raises(OwnershipError, match=taken):
        capture_now(_config(sources.a, sources.store, slot="lakefold_a2", prefix="b."))
    assert _nothing_on(sources.a)[0] == [default_slot]

    # dropping through the wrong source is refused: A's capture stays whole
    with pytest.raises(OwnershipError, match="another source"):
        drop_capture(sources.b, sources.store, slot=default_slot, publication="lakefold")
    assert _nothing_on(sources.a)[0] == [default_slot]
    assert _store_rows(sources.store)[0] == both


def test_streams_status_and_console_list_both_sources(sources: TwoSources) -> None:
    execute(sources.a, "INSERT INTO orders VALUES (1, 1)")
    execute(sources.b, "INSERT INTO orders VALUES (1, 2)")
    capture_now(_config(sources.a, sources.store, slot="lakefold_a"))
    capture_now(_config(sources.b, sources.store, slot="lakefold_b", prefix="b."))
    where_a = f"127.0.0.1:{sources.port_a}/{sources.database}"
    where_b = f"127.0.0.1:{sources.port_b}/{sources.database}"

    listed = json.loads(_cli("capture", "streams", "--store-dsn", sources.store, "--json"))
    assert [(s["name"], s["slot"], s["source"], s["head"]) for s in listed] == [
        ("b.public.orders", "lakefold_b", where_b, 1),
        ("public.orders", "lakefold_a", where_a, 1)]
    table = _cli("capture", "streams", "--store-dsn", sources.store)
    assert where_a in table and where_b in table

    env = {"LAKEFOLD_STORE_DSN": sources.store, "LAKEFOLD_DSN": sources.a,
           "COLUMNS": "200"}
    status = json.loads(_cli("status", "--json", env=env))
    assert [(c["slot"], c["source"], c["stream_prefix"], c["streams"], c["records"])
            for c in status["captures"]] == [
        ("lakefold_a", where_a, "", ["public.orders"], 1),
        ("lakefold_b", where_b, "b.", ["b.public.orders"], 1)]
    text = _cli("status", env=env)
    assert where_a in text and where_b in text and "b.public.orders" in text

    # the console: both captures; the health of A's (its source), B's unknown (not missing)
    captures = read_captures(StoreAddresses(store_dsn=sources.store, source_dsn=sources.a))
    assert [(c["slot"], c["source"], c["stream_prefix"], c["streams"]) for c in captures] == [
        ("lakefold_a", where_a, "", ["public.orders"]),
        ("lakefold_b", where_b, "b.", ["b.public.orders"])]
    assert captures[0]["status"] != "missing"
    assert captures[1]["status"] == "unknown" and captures[1]["records"] == 1
    assert where_b in captures[1]["problems"][0]
    assert PASSWORD not in json.dumps(captures)


def test_the_cli_refuses_a_second_source_in_one_line_and_creates_nothing(
        sources: TwoSources) -> None:
    execute(sources.b, "INSERT INTO orders VALUES (1, 2)")
    _cli("capture", "run", "--dsn", sources.a, "--store-dsn", sources.store, "--table",
         "public.orders", "--until-current", "--json")
    base = ["capture", "run", "--dsn", sources.b, "--store-dsn", sources.store, "--table",
            "public.orders", "--until-current"]
    for extra, what in (([], "--slot"), (["--slot", "lakefold_b"], "--stream-prefix")):
        done = subprocess.run([str(CLI), *base, *extra], capture_output=True, text=True,
                              timeout=120, check=False)
        assert done.returncode != 0
        lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        assert len(lines) == 1 and what in lines[0], lines
        assert "another source" in lines[0] or "is used by slot" in lines[0], lines
        assert PASSWORD not in done.stdout + done.stderr
        assert _nothing_on(sources.b) == ([], [])
    _cli(*base, "--slot", "lakefold_b", "--stream-prefix", "b.", "--json")
    assert [s["name"] for s in json.loads(_cli("capture", "streams", "--store-dsn",
                                               sources.store, "--json"))] == [
        "b.public.orders", "public.orders"]


def test_two_first_starts_at_once_with_one_prefix_one_is_refused(sources: TwoSources) -> None:
    """The prefix is checked and the slot registered under one lock of the store: of two new
    captures of two sources started together with the same prefix, exactly one gets it."""
    configs = [_config(sources.a, sources.store, slot="lakefold_a"),
               _config(sources.b, sources.store, slot="lakefold_b")]
    barrier = threading.Barrier(2)
    outcomes: list[BaseException | None] = [None, None]

    def set_up(index: int) -> None:
        barrier.wait()
        try:
            Capture(configs[index]).setup()
        except BaseException as e:  # reported by the test
            outcomes[index] = e

    threads = [threading.Thread(target=set_up, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    refused = [e for e in outcomes if e is not None]
    assert len(refused) == 1 and isinstance(refused[0], OwnershipError), outcomes
    assert "stream prefix '' (none)" in str(refused[0])
    loser = sources.a if outcomes[0] is not None else sources.b
    assert _nothing_on(loser) == ([], [])
    assert [slot for slot, _ in _store_rows(sources.store)[0]] == [
        "lakefold_b" if loser == sources.a else "lakefold_a"]
