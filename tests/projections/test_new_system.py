"""The first hour of a new system: a projection over an event category that has no events yet
starts and waits for them; ``Runner.run`` says what each projection did; a runner that
stops leaves its projections ``stopped`` in the catalog, not ``running``."""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable
from typer.testing import CliRunner

from lakefold.cli import app
from lakefold.eventstore import EventStore
from lakefold.projections import Runner, RunnerConfig, UnknownSourceError, events, load_projections
from lakefold.projections.operations import Catalog, SinkRoots
from lakefold.projections.plan._input_checks import check_sources_exist
from lakefold.schemas.events import NewEvent
from tests.projections import helpers

pytestmark = pytest.mark.timeout(300)
MODULE = str(Path(__file__).with_name("new_system_projections.py"))


def _balances(catalog: Catalog) -> dict[str, int]:
    path = Path(catalog.current("balances").location("delta"))
    if not (path / "_delta_log").is_dir():
        return {}
    return {r["account"]: r["amount"] for r in DeltaTable(str(path)).to_pyarrow_table()
            .to_pylist()}


def _wait(predicate, what: str, timeout: float = 150) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_projection_over_an_empty_category_waits_for_its_events(pg, spark, tmp_path):
    helpers.append_orders(pg.dsn, random.Random(3), 5)  # other categories only
    config = RunnerConfig(store_dsn=pg.dsn, roots=SinkRoots.under(tmp_path), poll_seconds=0.2)
    stop = threading.Event()
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["reports"] = runner.run(stop=stop)
        except BaseException as e:
            outcome["error"] = e

    with Runner(spark, load_projections(MODULE), config) as runner, \
            Catalog(pg.dsn) as catalog, EventStore(pg.dsn) as store:
        runner.prepare()  # validates: an empty category is no error
        thread = threading.Thread(target=run)
        thread.start()
        try:
            _wait(lambda: "error" in outcome or any(
                p.name == "balances" and p.state == "running" for p in catalog.projections()),
                "the projection to start")
            assert "error" not in outcome, outcome.get("error")
            for n in range(3):
                store.append(f"acct-{n}", [NewEvent("Deposited", {"amount": 10 * (n + 1)})])
            _wait(lambda: _balances(catalog) == {"acct-0": 10, "acct-1": 20, "acct-2": 30},
                  "the first events of the category in the view")
            store.append("acct-1", [NewEvent("Deposited", {"amount": 25})])  # keeps reading
            _wait(lambda: _balances(catalog).get("acct-1") == 25, "a later event in the view")
            head = store.head()
        finally:
            stop.set()
            thread.join(timeout=120)
        assert not thread.is_alive() and "error" not in outcome, outcome.get("error")
        reports = outcome["reports"]
        assert isinstance(reports, list)
        (report,) = reports
        assert report.name == "balances" and report.generation == 1
        assert report.batches >= 2 and report.records == head
        assert report.position == {"acct": head}
        assert report.state == "stopped" and not report.caught_up  # not asked to catch up
        # The runner has gone: the catalog does not claim it still runs.
        assert catalog.projection("balances").state == "stopped"


def test_run_until_caught_up_prints_what_each_projection_did(pg, spark, tmp_path):
    """``lakefold run --until-caught-up`` prints one row per projection (batches, records,
    position, time, state) and leaves the catalog state ``stopped``; ``--json`` gives the
    same as data."""
    with EventStore(pg.dsn) as store:
        store.install()
        for n in range(7):
            store.append(f"acct-{n}", [NewEvent("Deposited", {"amount": n})])
        head = store.wait_for_positions(
            store.append("acct-0", [NewEvent("Deposited", {"amount": 99})])).events[0].position
    env = {"LAKEFOLD_STORE_DSN": pg.dsn, "LAKEFOLD_HOME": str(tmp_path),
           "LAKEFOLD_SPARK_MASTER": "local[2]"}
    result = CliRunner().invoke(app, ["run", "-p", MODULE, "--until-caught-up", "--trigger",
                                      "0.2"], env=env)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "balances" in line]
    assert len(lines) == 2, result.output  # "running balances until caught up", and its row
    row = lines[1]
    assert "caught up" in row and f"acct={head}" in row and f" {head} " in row, result.output
    assert " s " in row + " "  # the time it took
    with Catalog(pg.dsn) as catalog:
        assert catalog.projection("balances").state == "stopped"
    again = CliRunner().invoke(app, ["run", "-p", MODULE, "--until-caught-up", "--json"],
                               env=env)
    assert again.exit_code == 0, again.output
    (report,) = json.loads(again.stdout)  # warnings, if any, go to stderr
    assert report["name"] == "balances" and report["caught_up"] and report["state"] == "stopped"
    assert report["position"] == {"acct": head} and report["records"] == 0  # nothing new


def test_a_runner_that_ends_leaves_its_projections_stopped(pg, spark, tmp_path):
    with EventStore(pg.dsn) as store:
        store.install()
        store.wait_for_positions(store.append("acct-1", [NewEvent("Deposited", {"amount": 1})]))
    config = RunnerConfig(store_dsn=pg.dsn, roots=SinkRoots.under(tmp_path), poll_seconds=0.2)
    with Runner(spark, load_projections(MODULE), config) as runner, Catalog(pg.dsn) as catalog:
        runner.run(until_caught_up=True, timeout=150)
        assert catalog.projection("balances").state == "stopped"
        assert _balances(catalog) == {"acct-1": 1}


def test_an_empty_category_is_a_warning_that_names_the_closest_one(pg, caplog):
    helpers.append_orders(pg.dsn, random.Random(1), 2)
    with caplog.at_level(logging.WARNING, logger="lakefold.projections"):
        check_sources_exist(pg.dsn, [events("ordr", types=["Anything"])], projection="p")
    (record,) = caplog.records
    assert "event category 'ordr' has no events yet" in record.getMessage()
    assert "did you mean 'order'?" in record.getMessage()
    with pytest.raises(UnknownSourceError, match="event type 'Lost'"):  # typos still caught
        check_sources_exist(pg.dsn, [events("order", types=["Lost"])], projection="p")
