"""A hostile page in the operator's browser, for real: Chromium (Debian's, driven by
Playwright) opens pages of an attacker's server against the running system's console, and
nothing they do reaches the store.

- a cross-site form POST (from ``attacker.test``, and from another port of 127.0.0.1);
- a ``no-cors`` fetch (its custom header silently dropped) and a CORS fetch (its pre-flight
  never granted);
- DNS rebinding: ``rebind.test`` resolves to 127.0.0.1 (Chromium's ``--host-resolver-rules``),
  so the attacker's script runs in an origin whose requests land on the console;
- another port of 127.0.0.1 after the operator logged in to a console with a token (the
  cookie goes along: ``SameSite`` is per site, not per port);
- framing (clickjacking).

Each attack is checked where it would have had its effect: the catalog, the capture's control
row and the audit table; and each request that reached the console is seen refused.
Screenshots go to test-artifacts/console/."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Response, sync_playwright

from lakefold.console import ConsoleConfig
from lakefold.local import free_port
from lakefold.projections.operations import SinkRoots
from tests.console.conftest import ServedApp, System, wait_until

pytestmark = pytest.mark.timeout(300)

CHROMIUM = "/usr/bin/chromium"
# attacker.test: the attacker's own site; rebind.test: a name the attacker re-points at
# 127.0.0.1 after the page loaded (here: from the start, which is the same for the console)
RESOLVER = "MAP attacker.test 127.0.0.1, MAP rebind.test 127.0.0.1"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 f"--host-resolver-rules={RESOLVER}"]

ACTIONS = ("/api/projections/customer_cache/pause", "/api/captures/console/pause",
           "/api/projections/customer_cache/rebuild")


class Attacker:
    """The attacker's web server on 127.0.0.1 (any name that resolves there): serves the
    pages in ``pages`` by path."""

    def __init__(self) -> None:
        self.port = free_port()
        self.pages: dict[str, str] = {}
        pages = self.pages

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = pages.get(self.path.split("?")[0], "not here").encode()
                self.send_response(200 if self.path in pages else 404)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, host: str, path: str) -> str:
        return f"http://{host}:{self.port}{path}"

    def __enter__(self) -> Attacker:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def form_page(target: str) -> str:
    """A page that posts a form to ``target`` as soon as it loads."""
    return (f'<form id="f" method="POST" action="{target}"><input name="tables" '
            'value="public.customers"></form><script>document.getElementById("f").submit()'
            "</script>")


def fetch_page(console: str, paths: tuple[str, ...]) -> str:
    """A page that posts to each path with a ``no-cors`` fetch (custom header and all) and
    with a CORS fetch, then puts what happened in its title."""
    return f"""<script>
(async () => {{
  const seen = [];
  for (const path of {list(paths)!r}) {{
    try {{
      await fetch("{console}" + path, {{method: "POST", mode: "no-cors", credentials: "include",
        headers: {{"X-Lakefold-Request": "1", "Content-Type": "text/plain"}}, body: "{{}}"}});
      seen.push("no-cors sent");
    }} catch (e) {{ seen.push("no-cors error"); }}
    try {{
      const r = await fetch("{console}" + path, {{method: "POST", credentials: "include",
        headers: {{"X-Lakefold-Request": "1", "Content-Type": "application/json"}}, body: "{{}}"}});
      seen.push("cors " + r.status);
    }} catch (e) {{ seen.push("cors blocked"); }}
  }}
  document.title = "done: " + seen.join(", ");
}})();
</script>"""


FRAME_PAGE = ('<h1>Win a prize: click the button</h1><iframe id="victim" src="{console}/" '
              'width="1200" height="800" style="opacity:0.5" '
              'onload="document.title = \'framed\'"></iframe>')


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), "Chromium is missing: `make test` installs it (apt)"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    context.set_default_timeout(60_000)
    yield context
    context.close()


@pytest.fixture
def attacker() -> Iterator[Attacker]:
    with Attacker() as server:
        yield server


def _state(system: System) -> dict[str, Any]:
    """What the attacks aim at, read from the store itself."""
    with psycopg.connect(system.dsn) as conn:
        paused = conn.execute("SELECT paused FROM lakefold.projections "
                              "WHERE name = 'customer_cache'").fetchone()
        building = conn.execute("SELECT count(*) FROM lakefold.projection_generations "
                                "WHERE name = 'customer_cache'").fetchone()
        audit = conn.execute("SELECT count(*) FROM lakefold.console_audit").fetchone()
    capture = system.overview()["captures"][0]
    return {"projection paused": paused and paused[0], "generations": building,
            "audit rows": audit, "capture paused": capture["paused"]}


def _responses_from(page: Page, base: str) -> list[Response]:
    seen: list[Response] = []
    page.on("response", lambda r: seen.append(r) if r.url.startswith(base) else None)
    return seen


def _answered_but_hidden(page: Page, base: str) -> list[str]:
    """The page's requests to ``base`` that the console answered but Chromium kept the
    answer from the page (a no-cors fetch of a resource that is not for other origins)."""
    hidden: list[str] = []
    page.on("requestfailed", lambda r: hidden.append(r.url) if r.url.startswith(base)
            and "ERR_BLOCKED_BY_RESPONSE" in (r.failure or "") else None)
    return hidden


@pytest.mark.parametrize("origin", ["attacker.test", "127.0.0.1"], ids=["cross-site",
                                                                        "another-port"])
def test_a_cross_site_form_does_nothing(system: System, context: BrowserContext,
                                        attacker: Attacker, origin: str,
                                        artifacts: Path) -> None:
    before = _state(system)
    for number, path in enumerate((*ACTIONS, "/api/captures/console/resnapshot")):
        attacker.pages[f"/form{number}"] = form_page(system.url + path)
        page = context.new_page()
        seen = _responses_from(page, system.url)
        page.goto(attacker.url(origin, f"/form{number}"))
        page.wait_for_url(system.url + path)
        posts = [r.status for r in seen if r.request.method == "POST"]
        assert posts == [403], path  # it reached the console, which refused it
        assert "cross_origin" in page.content()
        page.close()
    assert _state(system) == before


def test_a_no_cors_fetch_does_nothing(system: System, context: BrowserContext,
                                      attacker: Attacker) -> None:
    before = _state(system)
    attacker.pages["/fetch"] = fetch_page(system.url, ACTIONS)
    page = context.new_page()
    hidden = _answered_but_hidden(page, system.url)
    page.goto(attacker.url("attacker.test", "/fetch"))
    wait_until(lambda: page.title().startswith("done"), what="the attack page's fetches")
    title = page.title()
    # each no-cors POST reached the console (its answer hidden from the page), each CORS
    # one was stopped at its pre-flight
    assert len(hidden) == len(ACTIONS) and title.count("cors blocked") == len(ACTIONS), title
    assert _state(system) == before


def test_dns_rebinding_reads_and_changes_nothing(system: System, context: BrowserContext,
                                                 artifacts: Path) -> None:
    before = _state(system)
    rebound = f"http://rebind.test:{system.console.port}"
    page = context.new_page()
    first = page.goto(rebound + "/")
    assert first is not None and first.status == 400
    page.screenshot(path=str(artifacts / "attack-dns-rebinding.png"))
    # the attacker's script, now same-origin with what answers on rebind.test:PORT
    statuses = page.evaluate("""async () => {
      const read = await fetch("/api/streams/public.customers/records?limit=5");
      const text = await read.text();
      const act = await fetch("/api/projections/customer_cache/pause", {method: "POST",
        headers: {"X-Lakefold-Request": "1"}});
      return [read.status, act.status, text];
    }""")
    assert statuses[:2] == [400, 400], statuses
    assert "bad_host" in statuses[2] and "name 1" not in statuses[2]
    assert _state(system) == before


def test_another_port_after_login_does_nothing(system: System, context: BrowserContext,
                                              attacker: Attacker, artifacts: Path) -> None:
    token = secrets.token_urlsafe(24)
    config = ConsoleConfig(store_dsn=system.dsn, roots=SinkRoots.under(system.home),
                           token=token, refresh_s=0.5)
    with ServedApp(config) as guarded:
        page = context.new_page()
        page.goto(guarded.url + "/")
        page.locator("#token").fill(token)
        page.locator("#login button").click()
        page.wait_for_selector("#live.on")
        assert any(c["name"] == "lakefold_console_session" for c in context.cookies())
        before = _state(system)
        attacker.pages["/fetch"] = fetch_page(guarded.url, ACTIONS)
        attacker.pages["/form"] = form_page(guarded.url + ACTIONS[0])
        evil = context.new_page()
        hidden = _answered_but_hidden(evil, guarded.url)
        evil.goto(attacker.url("127.0.0.1", "/fetch"))  # same site: the cookie goes along
        wait_until(lambda: evil.title().startswith("done"), what="the attack page's fetches")
        assert evil.title().count("cors blocked") == len(ACTIONS), evil.title()
        evil.goto(attacker.url("127.0.0.1", "/form"))
        evil.wait_for_url(guarded.url + ACTIONS[0])
        assert "cross_origin" in evil.content()
        assert len(hidden) == len(ACTIONS)  # every no-cors fetch reached the console
        assert _state(system) == before
        # the operator's own page still acts (and its session is what lets it)
        page.locator("#logout").click()
        page.wait_for_selector("#login")


def test_the_console_cannot_be_framed(system: System, context: BrowserContext,
                                      attacker: Attacker, artifacts: Path) -> None:
    attacker.pages["/frame"] = FRAME_PAGE.format(console=system.url)
    page = context.new_page()
    seen = _responses_from(page, system.url)
    page.goto(attacker.url("attacker.test", "/frame"))
    wait_until(lambda: page.title() == "framed", what="the frame to load (or fail to)")
    assert [r.status for r in seen if r.url == system.url + "/"] == [200]  # it was asked
    frame = page.frame_locator("#victim")
    assert frame.locator("#live").count() == 0 and frame.locator("button").count() == 0
    page.screenshot(path=str(artifacts / "attack-framing.png"))
