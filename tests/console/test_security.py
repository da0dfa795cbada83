"""The console against a hostile client, over HTTP (the same attacks from a real browser are in
``test_attacks``): foreign Host names, actions without the console's mark or from another
origin, NUL bytes, input that does not match the OpenAPI document, the watermark holder's
SQL, the token (sessions, logout, guessing, non-ASCII, weak ones), a refused re-snapshot, and
a view whose Delta table does not exist yet."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from typer.testing import CliRunner

from lakefold.cli import app as cli_app
from lakefold.console import ConsoleBindError, ConsoleConfig, check_bind
from lakefold.console._access import read_token_file
from lakefold.local import free_port
from lakefold.projections.operations import Catalog, SinkRoots
from tests.console.conftest import ACTION, ServedApp, System, wait_until
from tests.fixtures.postgres import TestDatabase

pytestmark = pytest.mark.timeout(300)

PAUSE = "/api/projections/customer_cache/pause"


def _audit_size(system: System) -> int:
    with psycopg.connect(system.dsn) as conn:
        row = conn.execute("SELECT count(*) FROM lakefold.console_audit").fetchone()
    return int(row[0]) if row else 0


def _paused(system: System, name: str = "customer_cache") -> bool:
    with psycopg.connect(system.dsn) as conn:
        row = conn.execute("SELECT paused FROM lakefold.projections WHERE name = %s",
                           (name,)).fetchone()
    return bool(row and row[0])


def _is_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error", "code"} and body["code"] == code, body
    return dict(body)


def test_a_foreign_host_name_is_refused_on_every_path(system: System) -> None:
    """DNS rebinding: a name the attacker controls, resolving to 127.0.0.1, reaches the
    console with that name in Host; nothing is read or done through it."""
    port = system.console.port
    with httpx.Client(base_url=system.url, timeout=30) as client:
        for path in ("/", "/api/overview", "/api/streams/public.customers/records",
                     "/metrics", "/openapi.json", "/static/console.js", "/api/stream"):
            response = client.get(path, headers={"Host": f"rebind.example:{port}"})
            _is_error(response, 400, "bad_host")
        before = _audit_size(system)
        response = client.post(PAUSE, headers={"Host": f"rebind.example:{port}", ACTION: "x"})
        _is_error(response, 400, "bad_host")
        assert _audit_size(system) == before and not _paused(system)
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"localhost.:{port}",
                     f"[::1]:{port}", "127.0.0.1"):
            assert client.get("/api/overview", headers={"Host": host}).status_code == 200, host


def test_an_action_needs_the_consoles_mark_and_origin(system: System) -> None:
    """What a cross-site form or a no-cors fetch can send is refused, and nothing is done or
    audited; the console's own page (its origin, the header) is served."""
    own = system.url
    other_port = f"http://127.0.0.1:{free_port()}"
    before = _audit_size(system)
    with httpx.Client(base_url=system.url, timeout=30) as client:
        # a form: no custom header, a form content type, a foreign origin
        form = client.post(PAUSE, data={"x": "1"}, headers={"Origin": "http://evil.example"})
        _is_error(form, 403, "cross_origin")
        # the same without an Origin (a client that is not a browser) still lacks the mark
        _is_error(client.post(PAUSE), 403, "missing_header")
        _is_error(client.post(PAUSE, headers={"Origin": own}), 403, "missing_header")
        for origin in (other_port, "null", "http://evil.example", own.replace("http", "https"),
                       "http://localhost.evil.example"):
            response = client.post(PAUSE, headers={"Origin": origin, ACTION: "x"})
            _is_error(response, 403, "cross_origin")
        response = client.post(PAUSE, headers={"Referer": f"{other_port}/attack.html",
                                                ACTION: "x"})
        _is_error(response, 403, "cross_origin")
        for path in ("/api/captures/console/pause", "/api/dead-letters/1/drop",
                     "/api/projections/customer_cache/rebuild"):
            _is_error(client.post(path, headers={"Origin": other_port}), 403, "cross_origin")
        assert _audit_size(system) == before and not _paused(system)
        # the page's own request: its origin and the mark
        done = client.post("/api/projections/customer_cache/resume",
                           headers={"Origin": own, ACTION: "page"})
        assert done.status_code == 200 and done.json()["changed"] is False
        # a pre-flight is never granted
        preflight = client.options(PAUSE, headers={
            "Origin": other_port, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": ACTION.lower()})
        assert "access-control-allow-origin" not in preflight.headers


def test_every_answer_keeps_the_page_out_of_frames(system: System) -> None:
    with system.client() as client:
        for path in ("/", "/api/overview", "/static/console.js", "/api/nothing", "/metrics"):
            response = client.get(path)
            assert response.headers["x-frame-options"] == "DENY", path
            assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
            assert "script-src 'self'" in response.headers["content-security-policy"]
            assert response.headers["x-content-type-options"] == "nosniff"
        assert client.get("/api/overview").headers["cache-control"] == "no-store"


def test_a_nul_byte_in_a_name_is_a_clean_400(system: System) -> None:
    with system.client() as client:
        for path, params in (("/api/streams/a%00b/records", {}),
                             ("/api/categories/a%00b/events", {}),
                             ("/api/views/a%00b/rows", {"key": "x"}),
                             ("/api/views/city_counts/rows", {"key": "a\x00b"}),
                             ("/api/dead-letters", {"projection": "a\x00b"}),
                             ("/api/history", {"subject": "a\x00b"}),
                             ("/api/projections/a%00b", {})):
            _is_error(client.get(path, params=params), 400, "bad_request")
        _is_error(client.post("/api/projections/a%00b/pause"), 400, "bad_request")


def test_input_that_does_not_match_the_document_is_422_without_echo(system: System) -> None:
    huge = "9" * 20_000  # in a body; a request line holds at most 16 KB
    line = huge[:8_000]
    with system.client() as client:
        for response in (
                client.get("/api/streams/public.customers/records", params={"limit": line}),
                client.get("/api/dead-letters", params={"status": "x" + line}),
                client.get("/api/dead-letters/notanumber" + line),
                client.post("/api/captures/console/resnapshot",
                            content=json.dumps({"tables": huge}),
                            headers={"Content-Type": "application/json"}),
                client.post("/api/captures/console/resnapshot", content=b"{not json" + b"9" * 99)):
            body = _is_error(response, 422, "invalid_request")
            assert huge[:50] not in response.text and len(response.content) < 2000
            assert body["error"].startswith("invalid request: ")
        limit = client.get("/api/streams/public.customers/records", params={"limit": "abc"})
        assert "limit" in limit.json()["error"] and "abc" not in limit.text


def test_the_api_shows_who_holds_the_watermark_never_their_sql(system: System) -> None:
    with psycopg.connect(system.dsn) as holder:
        holder.execute("SET application_name = 'a slow writer'")
        holder.execute("SELECT txid_current()")  # an xid: it holds the watermark
        holder.execute("SELECT 'card 4111 1111 1111 1111' AS secret")
        pid = holder.info.backend_pid

        def held() -> dict[str, Any] | None:
            store = system.overview()["event_store"]
            found = store["watermark_holder"]
            return found if found and found["pid"] == pid else None

        found = wait_until(held, what="the overview to name the watermark's holder")
        assert found["application"] == "a slow writer" and found["held_for_s"] >= 0
        assert set(found) == {"pid", "application", "state", "xact_start", "held_for_s",
                              "prepared"}
        with system.client() as client:
            assert "4111" not in client.get("/api/overview").text
            with client.stream("GET", "/api/stream") as events:
                line = next(line for line in events.iter_lines() if line.startswith("data:"))
            assert str(pid) in line and "4111" not in line
        holder.rollback()


def test_a_refused_resnapshot_answers_the_error_and_is_audited_refused(system: System) -> None:
    with system.client(headers={"X-Lakefold-Operator": "mallory"}) as client:
        for table in ("public.no_such_table", "pg_catalog.pg_class"):
            response = client.post("/api/captures/console/resnapshot",
                                   json={"tables": [table]})
            assert response.status_code == 409, response.text
            assert response.json()["code"] == "refused"
            (last,) = client.get("/api/audit", params={"limit": 1}).json()
            assert last["action"] == "resnapshot" and last["who"].startswith("mallory@")
            assert last["outcome"].startswith("refused: ") and table in json.dumps(last)
            assert last["outcome"][len("refused: "):] == response.json()["error"]


def test_a_views_rows_before_its_delta_table_exists(pg: TestDatabase, tmp_path: Path) -> None:
    roots = SinkRoots.under(tmp_path)
    with Catalog(pg.dsn, roots) as catalog:
        catalog.install()
        catalog.ensure("unwritten", target_kind="delta", fingerprint="f", keep_generations=1,
                       definition={"key": ["id"], "target": {"kind": "upsert",
                                                             "keys": ["id"]}})
    with ServedApp(ConsoleConfig(store_dsn=pg.dsn, roots=roots)) as console, \
            httpx.Client(base_url=console.url, timeout=30) as client:
        response = client.get("/api/views/unwritten/rows", params={"key": "1"})
        assert response.status_code == 200, response.text
        assert response.json()["rows"] == [] and response.json()["key_columns"] == ["id"]


# ------------------------------------------------------------------ the token


def _guarded(system: System, token: str) -> ServedApp:
    return ServedApp(ConsoleConfig(store_dsn=system.dsn, roots=SinkRoots.under(system.home),
                                   token=token))


def _login(client: httpx.Client, token: str) -> httpx.Response:
    return client.post("/login", json={"token": token}, headers={ACTION: "login"})


def test_the_cookie_is_a_session_that_logout_ends(system: System) -> None:
    token = secrets.token_urlsafe(24)
    with _guarded(system, token) as guarded, \
            httpx.Client(base_url=guarded.url, timeout=30) as client:
        # login itself is an action: a cross-site form cannot log a browser in
        _is_error(client.post("/login", json={"token": token}), 403, "missing_header")
        answer = _login(client, token)
        assert answer.status_code == 204
        cookie = answer.headers["set-cookie"]
        assert token not in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
        assert "Max-Age=" in cookie
        session = client.cookies["lakefold_console_session"]
        assert client.get("/api/overview").status_code == 200
        assert client.post("/logout", headers={ACTION: "page"}).status_code == 204
        assert client.get("/api/overview").status_code == 401
        # the old cookie, replayed, is dead
        client.cookies.set("lakefold_console_session", session)
        assert client.get("/api/overview").status_code == 401
        # the raw token as a cookie is no session
        client.cookies.set("lakefold_console_session", token)
        assert client.get("/api/overview").status_code == 401


def test_guessing_the_token_is_limited(system: System) -> None:
    token = secrets.token_urlsafe(24)
    with _guarded(system, token) as guarded, \
            httpx.Client(base_url=guarded.url, timeout=30) as client:
        answers = [_login(client, f"guess-{i}").status_code for i in range(8)]
        assert answers[:5] == [401] * 5 and set(answers[5:]) == {429}, answers
        locked = _login(client, token)  # the right one learns nothing while locked out
        assert locked.status_code == 429 and int(locked.headers["retry-after"]) > 0
        bearer = client.get("/api/overview", headers={"Authorization": f"Bearer {token}"})
        assert bearer.status_code == 429


def test_a_non_ascii_token_works_as_bearer_and_at_the_login(system: System) -> None:
    token = "grüße-€-" + secrets.token_hex(8)
    with _guarded(system, token) as guarded, \
            httpx.Client(base_url=guarded.url, timeout=30) as client:
        raw = b"Bearer " + token.encode("utf-8")
        assert client.get("/api/overview", headers={b"Authorization": raw}).status_code == 200
        wrong = b"Bearer " + token.encode("utf-8")[:-1] + b"x"
        assert client.get("/api/overview", headers={b"Authorization": wrong}).status_code == 401
        assert _login(client, token).status_code == 204
        assert client.get("/api/overview").status_code == 200


def test_a_token_posted_as_a_form_is_never_echoed(system: System) -> None:
    token = secrets.token_urlsafe(24)
    with _guarded(system, token) as guarded, \
            httpx.Client(base_url=guarded.url, timeout=30) as client:
        response = client.post("/login", data={"token": token}, headers={ACTION: "x"})
        assert response.status_code == 400 and token not in response.text
        assert response.json()["code"] == "bad_request"


def test_the_openapi_document_declares_what_a_token_console_asks(system: System) -> None:
    token = secrets.token_urlsafe(24)
    with _guarded(system, token) as guarded, httpx.Client(
            base_url=guarded.url, timeout=30,
            headers={"Authorization": f"Bearer {token}"}) as client:
        spec = client.get("/openapi.json").json()
    schemes = spec["components"]["securitySchemes"]
    assert schemes["bearer"] == {"type": "http", "scheme": "bearer",
                                 "description": "The console's token."}
    assert schemes["session"]["in"] == "cookie"
    assert spec["security"] == [{"bearer": []}, {"session": []}]
    pause = spec["paths"]["/api/projections/{name}/pause"]["post"]
    assert {"name": ACTION, "in": "header", "required": True}.items() <= \
        next(p for p in pause["parameters"] if p["name"] == ACTION).items()
    assert {"403", "422"} <= set(pause["responses"])
    assert pause["responses"]["422"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorBody"}


def test_weak_blank_and_spaced_tokens_are_refused() -> None:
    for host in ("0.0.0.0", "192.0.2.7", "::"):  # noqa: S104
        for weak in (" ", "short", "aaaaaaaaaaaaaaaaaaaaaaaa", "abcabcabcabcabcabc"):
            with pytest.raises(ConsoleBindError):
                check_bind(host, weak)
        check_bind(host, secrets.token_urlsafe(24))
    for bad in (" ", "\t", " padded-token-abcdefgh ", "new\nline-abcdefghijkl"):
        with pytest.raises(ConsoleBindError):
            check_bind("127.0.0.1", bad)
    check_bind("127.0.0.1", "short")  # loopback: any printable token is better than none


def test_the_token_comes_from_a_file_and_argv_warns(tmp_path: Path) -> None:
    token = secrets.token_urlsafe(24)
    path = tmp_path / "token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    assert read_token_file(path) == token
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ConsoleBindError, match="is empty"):
        read_token_file(empty)
    runner = CliRunner()
    refused = runner.invoke(cli_app, ["console", "--host", "0.0.0.0",  # noqa: S104
                                      "--token-file", str(empty)], env={"LAKEFOLD_DSN": ""})
    assert isinstance(refused.exception, ConsoleBindError)
    weak = runner.invoke(cli_app, ["console", "--host", "0.0.0.0", "--token", "x"])  # noqa: S104
    assert isinstance(weak.exception, ConsoleBindError) and "weak token" in str(weak.exception)
