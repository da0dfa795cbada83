"""The console's page in headless Chromium (Debian's, driven by Playwright) against the running
system: it loads offline, draws the DAG with every registered view, its lag figure moves while
a workload runs, pausing from the page pauses the projection (the API and `lakefold status`
agree), a dead letter is retried from the page, and a store that goes down shows a banner
that goes away when it is back. Screenshots go to test-artifacts/console/."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from lakefold.console import ConsoleConfig
from lakefold.local import LocalPostgres
from lakefold.projections import load_projections
from lakefold.projections.operations import Catalog, SinkRoots
from tests.console.conftest import ServedApp, System, wait_until

pytestmark = pytest.mark.timeout(300)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), "Chromium is missing: `make test` installs it (apt)"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 1800})
    page = context.new_page()
    page.set_default_timeout(60_000)
    yield page
    context.close()


def _open(page: Page, url: str) -> list[str]:
    """Open the console; returns the list that collects every URL the page requests."""
    requested: list[str] = []
    errors: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(url + "/")
    page.wait_for_selector("#live.on")
    assert not errors, errors
    return requested


def _row(page: Page, name: str) -> Any:
    return page.locator(f'tr[data-projection="{name}"]')


def _confirm(page: Page) -> None:
    page.locator("#confirm-yes").click()


def test_the_page_loads_offline_with_the_dag_and_history(system: System, page: Page,
                                                           artifacts: Path) -> None:
    requested = _open(page, system.url)
    views = load_projections(str(system.module)).views
    assert len(views) == 2
    for name in views:
        page.wait_for_selector(f'#dag g.node[data-id="view:{name}"]')
    nodes = page.locator("#dag g.node")
    health = {nodes.nth(i).get_attribute("data-id"): nodes.nth(i).get_attribute("data-health")
              for i in range(nodes.count())}
    assert health["projection:revenue"] == "warning"  # it holds dead letters
    assert health["view:city_counts"] == "ok"
    assert page.locator("#dag path.edge").count() >= 8
    page.wait_for_selector('.chart[data-subject="projection:customer_cache"] polyline',
                           state="attached")
    assert _row(page, "city_counts").locator(".state").inner_text() == "running"
    page.screenshot(path=str(artifacts / "overview.png"), full_page=True)
    assert requested and all(url.startswith(system.url) for url in requested), requested


def test_pausing_from_the_page_and_the_lag_moving_with_a_workload(system: System, page: Page,
                                                                   artifacts: Path) -> None:
    _open(page, system.url)
    row = _row(page, "customer_cache")
    row.locator('button[data-action="pause"]').click()
    assert "pause projection customer_cache?" in page.locator("#confirm-text").inner_text()
    page.screenshot(path=str(artifacts / "pause-confirmation.png"))
    _confirm(page)
    wait_until(lambda: system.projection("customer_cache")["paused"], what="the API's pause")
    status = json.loads(system.lakefold("status", "--json"))
    assert {p["name"]: p["paused"] for p in status["projections"]}["customer_cache"] is True
    row.locator('button[data-action="resume"]').wait_for()
    lag = row.locator(".lag")
    assert lag.inner_text() == "0"
    system.write_customers(40)  # the workload: the capture stores it, the paused cache lags
    wait_until(lambda: lag.inner_text() not in ("0", ""), what="the lag figure to move")
    first = lag.inner_text()
    page.screenshot(path=str(artifacts / "paused-with-lag.png"), full_page=True)
    row.locator('button[data-action="resume"]').click()
    _confirm(page)
    wait_until(lambda: lag.inner_text() == "0", what="the lag figure back to 0 after resume")
    assert first != "0" and not system.projection("customer_cache")["paused"]
    page.locator("#audit tbody tr").first.wait_for()
    assert "resume" in page.locator("#audit tbody tr").first.inner_text()


def test_a_dead_letter_is_retried_from_the_page(system: System, page: Page,
                                                artifacts: Path) -> None:
    (system.home / "antidote").touch()  # the poison is fixed: a retry folds it in
    _open(page, system.url)
    button = page.locator('#dead-letters tr button[data-action="retry"]').first
    button.wait_for()
    letter = button.get_attribute("data-id")
    page.locator(f'#dead-letters tr[data-letter="{letter}"] button[data-action="show-letter"]'
                 ).click()
    page.wait_for_selector("#dead-letter:not([hidden])")
    assert "poison order" in page.locator("#dead-letter").inner_text()
    button.click()
    _confirm(page)

    def status() -> str:
        with system.client() as client:
            return str(client.get(f"/api/dead-letters/{letter}").json()["status"])

    wait_until(lambda: status() == "resolved", what="the retried dead letter to resolve",
               timeout=120)
    status_cell = page.locator(f'#dead-letters tr[data-letter="{letter}"] .status')
    wait_until(lambda: status_cell.inner_text() == "resolved", what="the page's status")
    page.screenshot(path=str(artifacts / "dead-letter-retried.png"), full_page=True)


def test_a_store_that_goes_down_shows_a_banner_until_it_is_back(page: Page, tmp_path: Path,
                                                                artifacts: Path) -> None:
    server = LocalPostgres(tmp_path / "pg", durable=False)
    server.start()
    try:
        config = ConsoleConfig(store_dsn=server.dsn(), roots=SinkRoots.under(tmp_path),
                               refresh_s=0.3)
        with Catalog(server.dsn(), SinkRoots.under(tmp_path)) as catalog:
            catalog.install()
            catalog.ensure("lonely", target_kind="delta", fingerprint="f", keep_generations=1,
                           definition={"style": "view", "target": {"kind": "delta"}})
        with ServedApp(config) as console:
            _open(page, console.url)
            banner = page.locator("#banner")
            assert banner.is_hidden()
            page.wait_for_selector('#dag g.node[data-id="view:lonely"][data-health="ok"]')
            server.stop()
            banner.wait_for(state="visible")
            assert "Store unavailable" in banner.inner_text()
            page.wait_for_selector("#live.off")  # not "live" while nothing can be read
            assert page.locator("#live").inner_text() == "store down"
            health = page.locator("#health").inner_text()
            assert "cannot be read" in health and health.count("cannot be read") == 1, health
            # What was read last stays, greyed: no node, row or capture claims to be ok.
            page.wait_for_selector("main.stale")
            assert page.locator("#read-at").inner_text().startswith("last read")
            nodes = page.locator("#dag g.node")
            assert nodes.count() >= 2
            assert {nodes.nth(i).get_attribute("data-health") for i in range(nodes.count())
                    } == {"unknown"}
            assert page.locator('#projections .health-ok').count() == 0
            page.screenshot(path=str(artifacts / "store-down-banner.png"), full_page=True)
            server.start()
            banner.wait_for(state="hidden")
            page.wait_for_selector('#dag g.node[data-id="view:lonely"][data-health="ok"]')
            assert page.locator("main.stale").count() == 0
    finally:
        server.stop()


def test_the_page_asks_for_the_token(system: System, page: Page) -> None:
    token = secrets.token_hex(12)
    config = ConsoleConfig(store_dsn=system.dsn, roots=SinkRoots.under(system.home),
                           token=token)
    with ServedApp(config) as console:
        page.goto(console.url + "/")
        page.locator("#token").fill("wrong")
        page.locator("#login button").click()
        page.wait_for_selector("#error:has-text('not the token')")
        page.locator("#token").fill(token)
        page.locator("#login button").click()
        page.wait_for_selector("#live.on")
        assert token not in page.content()


def test_the_health_summary_says_what_needs_a_person(system: System, page: Page) -> None:
    _open(page, system.url)
    page.wait_for_selector("#health li:not(.muted)")
    overview = system.overview()
    text = page.locator("#health").inner_text()
    needing = [p["name"] for p in overview["projections"] if p["dead_letters"]]
    for name in needing:
        assert f"projection {name} has" in text and "dead letter" in text, text
    if not needing:
        assert text.startswith("All is well"), text
    lag = _row(page, "customer_cache").locator(".lag-seconds").inner_text()
    assert lag.endswith((" s", " min", " h", " d")), lag  # a duration, not raw seconds


def test_the_page_fits_800_px_and_fetches_only_new_history(system: System, browser: Browser,
                                                            artifacts: Path) -> None:
    context = browser.new_context(viewport={"width": 800, "height": 1400})
    page = context.new_page()
    page.set_default_timeout(60_000)
    try:
        histories: list[str] = []
        page.on("request", lambda r: histories.append(r.url) if "/api/history" in r.url
                else None)
        _open(page, system.url)
        page.wait_for_selector(".chart polyline", state="attached")
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 800, width
        page.screenshot(path=str(artifacts / "overview-800px.png"), full_page=True)
        later = page.wait_for_event("request", predicate=lambda r: "/api/history" in r.url,
                                    timeout=60_000)  # the page asks again every 10 s
        assert "since=" not in histories[0] and "since=" in later.url, (histories, later.url)
        charts = page.locator('.chart[data-metric="lag_seconds"] line.threshold')
        assert charts.count() >= 1  # lag charts draw the limit the alerts use
    finally:
        context.close()


def test_rebuild_is_offered_only_when_the_console_can_rebuild(system: System,
                                                               page: Page) -> None:
    _open(page, system.url)
    _row(page, "customer_cache").locator('button[data-action="rebuild"]').wait_for()
    config = ConsoleConfig(store_dsn=system.dsn, roots=SinkRoots.under(system.home))
    with ServedApp(config) as bare:  # no --projections: it cannot rebuild
        other = page.context.new_page()
        _open(other, bare.url)
        _row(other, "customer_cache").wait_for()
        assert other.locator('button[data-action="rebuild"]').count() == 0
        assert _row(other, "customer_cache").locator('button[data-action="pause"], '
                                                     'button[data-action="resume"]').count()


def test_each_projection_view_and_capture_has_its_page(system: System, page: Page,
                                                      artifacts: Path) -> None:
    """From the overview a click opens an item's page: state, lag with units, throughput,
    last batches, errors in full, dead letters, inputs, readers, target and its history."""
    _open(page, system.url)
    overview = system.overview()
    # a view's page, from its name in the table
    _row(page, "city_counts").locator("a").click()
    page.wait_for_selector("body.detail-open #detail h2:has-text('view city_counts')")
    assert page.locator("#projections-section").is_hidden()  # the page replaces the overview
    facts = page.locator("#detail table.facts").inner_text()
    for label in ("state", "behind by", "throughput", "last batch", "dead letters", "reads",
                  "read by", "target"):
        assert label in facts, facts
    assert "records/s" in facts and "records" in facts
    inputs = page.locator("#detail table.inputs tbody tr")
    assert inputs.count() == 1 and "customer_cities" in inputs.first.inner_text()
    # its input is a link to the upstream view's page, whose "read by" names it back
    page.locator("#detail table.facts a:has-text('customer_cities')").click()
    page.wait_for_selector("#detail h2:has-text('view customer_cities')")
    assert "city_counts" in page.locator("#detail table.facts").inner_text()
    # a projection with dead letters: the letters with their whole error, and its batches
    page.goto(system.url + "/#projection/revenue")
    page.wait_for_selector("#detail h2:has-text('projection revenue')")
    page.wait_for_selector("#detail table.batches tbody tr td.num")
    with system.client() as client:
        batches = client.get("/api/projections/revenue/batches").json()
        letters = client.get("/api/dead-letters", params={"projection": "revenue"}).json()
    assert batches and sum(b["rows"] for b in batches) >= 1
    first = page.locator("#detail table.batches tbody tr").first.inner_text()
    assert str(batches[0]["batch_id"]) in first, first
    if letters:
        text = page.locator("#detail table.letters").inner_text()
        assert letters[0]["error"] in text, text  # whole, not cut
    page.screenshot(path=str(artifacts / "projection-page.png"), full_page=True)
    # a capture's page, from the DAG: its streams, who reads them, their latest records
    page.goto(system.url + "/")
    page.wait_for_selector("#live.on")
    slot = overview["captures"][0]["slot"]
    page.locator(f'#dag a g.node[data-id="capture:{slot}"]').click()
    page.wait_for_selector(f"#detail h2:has-text('capture {slot}')")
    streams = page.locator("#detail table.streams tbody tr")
    streams.first.locator("td.num").first.wait_for()
    row = page.locator("#detail table.streams tr:has-text('public.customers')")
    assert "customer_cache" in row.inner_text() and "customer_cities" in row.inner_text()
    row.locator('button[data-action="peek"]').click()
    page.wait_for_selector("#detail-inside table.peek")
    assert "stream public.customers" in page.locator("#detail-inside").inner_text()
    page.screenshot(path=str(artifacts / "capture-page.png"), full_page=True)
    # back to the overview
    page.locator("#detail a.back").click()
    page.wait_for_selector("#projections-section", state="visible")
    assert page.locator("#detail").is_hidden()
    # an unknown name says so
    page.goto(system.url + "/#projection/no_such_thing")
    page.wait_for_selector("#detail .health-failed:has-text('no projection or view named')")


def test_the_pickers_show_one_choice_at_a_time(system: System, page: Page) -> None:
    _open(page, system.url)
    page.wait_for_selector('#stream-pick option[value="public.customers"]', state="attached")
    page.select_option("#stream-pick", "public.customers")
    page.wait_for_selector("#inside table.peek")
    page.wait_for_selector('#category-pick option[value="order"]', state="attached")
    page.select_option("#category-pick", "order")
    page.wait_for_selector("#inside p:has-text('category')")
    assert page.locator("#stream-pick").input_value() == ""
    page.select_option("#view-pick", "customer_cache")
    assert page.locator("#category-pick").input_value() == ""
    assert page.locator("#inside").inner_text() == ""  # what showed belonged to another pick
