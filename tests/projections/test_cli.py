"""The projection commands that read or change the catalog (no Spark needed): status, pause,
resume, dlq list|retry|drop, search; and their one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from lakefold.cli import app
from lakefold.projections import DeadLetters
from lakefold.projections.operations import Catalog, SinkRoots
from lakefold.projections.state._deadletters import NewDeadLetter
from lakefold.projections.targets._search import IndexLayout, SearchIndexWriter

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def env(pg, tmp_path):
    catalog = Catalog(pg.dsn, SinkRoots.under(tmp_path))
    catalog.install()
    DeadLetters(catalog).install()
    catalog.ensure("products", target_kind="search", fingerprint="f", keep_generations=1,
                   definition={"sources": []})
    catalog.record_batch("products", 1, 0, {"products": 11}, 10)
    DeadLetters(catalog).add("products", 1, [NewDeadLetter(
        ref="fold:products:4", stage="fold", source="products", position=4,
        record={"id": 4}, error="ValueError: bad price", attempts=3)])
    layout = IndexLayout.from_arrow(pa.schema([("id", pa.int64()), ("name", pa.string())]),
                                    key="id", text=("name",))
    writer = SearchIndexWriter(catalog.current("products").location("search"), layout)
    writer.write(pa.Table.from_pylist([{"id": 1, "name": "oak lamp"},
                                       {"id": 2, "name": "steel mug"}]), batch_id=0)
    writer.close()
    catalog.close()
    return {"LAKEFOLD_STORE_DSN": pg.dsn, "LAKEFOLD_HOME": str(tmp_path)}


def invoke(env: dict[str, str], *args: str) -> str:
    result = CliRunner().invoke(app, list(args), env=env)
    assert result.exit_code == 0, result.output
    return result.output


def test_status_json(env):
    status = json.loads(invoke(env, "status", "--json"))
    (entry,) = status["projections"]
    assert (entry["name"], entry["generation"], entry["target"]) == ("products", 1, "search")
    assert entry["dead_letters"] == 1 and entry["state"] == "idle"
    assert "products" in invoke(env, "status")


def test_pause_resume(env, pg):
    assert "paused" in invoke(env, "pause", "products")
    with Catalog(pg.dsn) as catalog:
        catalog.set_state("products", "paused")  # as a runner does when it takes the pause up
        (entry,) = json.loads(invoke(env, "status", "--json"))["projections"]
        assert (entry["state"], entry["paused"]) == ("paused", True)
        assert "resumed" in invoke(env, "resume", "products")
        assert not catalog.projection("products").paused
        # until a runner takes the resume up the catalog still says paused: status, resuming
        assert catalog.projection("products").state == "paused"
        (entry,) = json.loads(invoke(env, "status", "--json"))["projections"]
        assert (entry["state"], entry["paused"]) == ("resuming", False)
        catalog.set_state("products", "running")  # taken up (by no runner here: stopped)
        (entry,) = json.loads(invoke(env, "status", "--json"))["projections"]
        assert entry["state"] == "stopped"


def test_dead_letter_commands(env):
    (letter,) = json.loads(invoke(env, "dlq", "list", "--json"))
    assert (letter["stage"], letter["position"], letter["status"]) == ("fold", 4, "open")
    table = invoke(env, "dlq", "list", "products")
    assert "open" in table and "fold" in table
    assert "queued 1" in invoke(env, "dlq", "retry", str(letter["id"]))
    (letter,) = json.loads(invoke(env, "dlq", "list", "--json", "--status", "retry"))
    result = CliRunner().invoke(app, ["dlq", "drop", str(letter["id"])], env=env)
    assert result.exit_code != 0 and "is retry, not open" in str(result.exception)


def test_search_command(env):
    hits = json.loads(invoke(env, "search", "products", "lamp", "--json"))
    assert [h["key"] for h in hits] == ["1"]
    assert "oak lamp" in invoke(env, "search", "products", "oak")


def test_errors_are_clear(env, tmp_path: Path):
    result = CliRunner().invoke(app, ["pause", "nope"], env=env)
    assert "not in the catalog" in str(result.exception)
    result = CliRunner().invoke(app, ["run"], env=env)
    assert "--projections" in str(result.exception)
    result = CliRunner().invoke(app, ["status"], env={"LAKEFOLD_HOME": str(tmp_path)})
    assert "LAKEFOLD_STORE_DSN" in str(result.exception)


def test_late_commands(env, pg):
    import numpy as np
    import psycopg

    from lakefold.projections.state._late_events import install_late_events, record_late

    minute = 60_000_000
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        install_late_events(conn)
        with conn.transaction():
            record_late(conn, "products", 1, "views", np.array([7, 9]),
                        np.array([0, minute]), minute, np.array([30, minute + 5]),
                        np.array([3 * minute, 3 * minute]))
    listed = json.loads(invoke(env, "late", "list", "products", "--json"))
    assert [(e["position"], e["status"], e["late_by_seconds"]) for e in listed] == [
        (9, "late", 60.0), (7, "late", 120.0)]
    assert "late events of products" in invoke(env, "late", "list", "products")
    assert "1 late event window(s)" in invoke(env, "late", "replay", "products",
                                               "--position", "7")
    assert [e["position"] for e in json.loads(invoke(
        env, "late", "list", "products", "--json", "--status", "replayed"))] == [7]
    assert "no late events" in invoke(env, "late", "replay", "products", "--position", "7")
    assert "1 late event window(s)" in invoke(env, "late", "replay", "products")
    result = CliRunner().invoke(app, ["late", "list", "nope"], env=env)
    assert "not in the catalog" in str(result.exception)
    result = CliRunner().invoke(app, ["late", "list", "products", "--status", "lost"], env=env)
    assert "'late' or 'replayed'" in str(result.exception)
