"""The console's JSON API against the running system (real PostgreSQL, Redis, a running
capture and a running ``lakefold run``): the overview, looking inside, actions and their
audit, /metrics, /openapi.json, and the bad input of the issue (404, no-op pause, 401, 503)."""

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
from lakefold.console._models import Overview, ProjectionState
from lakefold.local import LocalPostgres
from lakefold.projections.operations import SinkRoots
from tests.console.conftest import ACTION, PROJECTIONS, ServedApp, System, wait_until

pytestmark = pytest.mark.timeout(300)


def test_overview_shows_captures_event_store_projections_and_the_dag(system: System) -> None:
    overview = system.overview()
    (capture,) = overview["captures"]
    assert capture["slot"] == "console" and capture["streams"] == ["public.customers"]
    assert capture["wal_status"] in ("reserved", "extended")
    assert {"lag_bytes", "lag_seconds", "safe_wal_size", "changes_per_s",
            "snapshots"} <= set(capture)
    store = overview["event_store"]
    assert store["head"] >= 20 and store["watermark_held"] is False
    names = {p["name"]: p for p in overview["projections"]}
    assert set(PROJECTIONS) <= set(names)
    cities = names["city_counts"]
    assert cities["style"] == "view" and cities["generation"] >= 1
    assert cities["sources"] and all("lag_records" in s for s in cities["sources"])
    assert names["revenue"]["dead_letters"] == 4 and names["revenue"]["health"] == "warning"
    dag = overview["dag"]
    ids = {n["id"] for n in dag["nodes"]}
    assert {"capture:console", "changelog:public.customers", "events:order",
            "projection:customer_cache", "view:customer_cities", "view:city_counts"} <= ids
    edges = {(e["from"], e["to"]) for e in dag["edges"]}
    assert ("view:customer_cities", "view:city_counts") in edges
    assert ("changelog:public.customers", "view:customer_cities") in edges
    assert all(n["health"] in ("ok", "warning", "failed") for n in dag["nodes"])


def test_changes_flow_into_the_overview_and_its_rates(system: System) -> None:
    before = system.overview()
    records = before["captures"][0]["records"]
    system.write_customers(30)
    wait_until(lambda: system.overview()["captures"][0]["records"] >= records + 30,
               what="the capture to store the new customers")
    wait_until(lambda: system.projection("customer_cache")["lag_records"] == 0,
               what="customer_cache to catch up")


def test_one_capture_and_the_last_batches_of_a_projection_and_a_view(system: System) -> None:
    """What an item's page reads: the capture as in the overview, and the last batches of a
    projection and of a view (each a record of what it applied), newest first."""
    stored = system.overview()["captures"][0]["records"]
    system.write_customers(5)
    wait_until(lambda: system.overview()["captures"][0]["records"] >= stored + 5,
               what="the capture to store the new customers")
    wait_until(lambda: system.projection("city_counts")["lag_records"] == 0
               and system.projection("customer_cache")["lag_records"] == 0,
               what="the views to catch up")
    with system.client() as client:
        capture = client.get("/api/captures/console").json()
        listed = next(c for c in system.overview()["captures"] if c["slot"] == "console")
        assert set(capture) == set(listed) and capture["slot"] == "console"
        assert capture["streams"] == listed["streams"] == ["public.customers"]
        missing = client.get("/api/captures/nothing")
        assert missing.status_code == 404 and missing.json()["code"] == "not_found"
        for name in ("customer_cache", "city_counts"):
            batches = client.get(f"/api/projections/{name}/batches",
                                 params={"limit": 5}).json()
            assert 1 <= len(batches) <= 5, (name, batches)
            assert [b["committed_at"] for b in batches] == sorted(
                (b["committed_at"] for b in batches), reverse=True)
            assert all(b["rows"] >= 0 and b["end_position"] for b in batches)
            one = client.get(f"/api/projections/{name}").json()
            assert one["last_batch_at"] is not None, one  # views too
        assert client.get("/api/projections/nothing/batches").status_code == 404
        assert client.get("/api/projections/revenue/batches",
                          params={"limit": 0}).status_code == 422


def test_look_inside_a_stream_newest_first_paged(system: System) -> None:
    with system.client() as client:
        streams = client.get("/api/streams").json()
        by_name = {s["name"]: s for s in streams}
        assert by_name["public.customers"]["slot"] == "console"
        listed = by_name["public.customers"]["head"]
        page = client.get("/api/streams/public.customers/records", params={"limit": 5}).json()
        positions = [r["_position"] for r in page["records"]]
        # the page's head is read with its records (the capture may store more in between)
        assert page["head"] >= listed
        assert positions == sorted(positions, reverse=True) and positions[0] == page["head"]
        assert all(r["_schema_version"] >= 1 for r in page["records"])
        assert page["schema_version"] >= 1 and page["next_before"] == positions[-1]
        older = client.get("/api/streams/public.customers/records",
                           params={"limit": 5, "before": page["next_before"]}).json()
        assert [r["_position"] for r in older["records"]] \
            == [p - 5 for p in positions]
        missing = client.get("/api/streams/public.nothing/records")
        assert missing.status_code == 404
        assert "no changelog stream named 'public.nothing'" in missing.json()["error"]


def test_look_inside_an_event_category(system: System) -> None:
    with system.client() as client:
        assert "order" in client.get("/api/categories").json()
        page = client.get("/api/categories/order/events", params={"limit": 3}).json()
        assert [e["position"] for e in page["events"]] == [page["head"] - i for i in range(3)]
        assert all(e["type"] == "OrderPlaced" and e["schema_version"] == 1
                   for e in page["events"])
        assert "amount" in page["events"][0]["data"]
        missing = client.get("/api/categories/nothing/events")
        assert missing.status_code == 404 and missing.json()["code"] == "not_found"


def test_a_views_rows_for_one_key(system: System) -> None:
    with psycopg.connect(system.dsn) as conn:
        row = conn.execute("SELECT count(*) FROM customers WHERE city = 'Lima'").fetchone()
    assert row is not None
    with system.client() as client:
        def lima() -> list[dict[str, object]]:
            rows = client.get("/api/views/city_counts/rows", params={"key": "Lima"}).json()
            return rows["rows"] if rows["rows"] and rows["rows"][0]["customers"] == row[0] \
                else []

        (found,) = wait_until(lima, what="city_counts to count Lima's customers")
        assert found["city"] == "Lima"
        cached = client.get("/api/views/customer_cache/rows", params={"key": "7"}).json()
        assert cached["rows"][0]["name"] == "name 7"
        assert client.get("/api/views/nothing/rows", params={"key": "x"}).status_code == 404
        assert client.get("/api/views/city_counts/rows").status_code == 422


def test_pause_resume_with_audit_and_a_no_op_pause(system: System) -> None:
    headers = {"X-Lakefold-Operator": "ada"}
    with system.client(headers=headers) as client:
        first = client.post("/api/projections/customer_cache/pause").json()
        assert first["changed"] is True and first["message"] == "projection customer_cache paused"
        again = client.post("/api/projections/customer_cache/pause").json()
        assert again["changed"] is False
        assert "already paused; nothing was changed" in again["message"]
        wait_until(lambda: system.projection("customer_cache")["state"] == "paused",
                   what="the paused state")
        status = json.loads(system.lakefold("status", "--json"))
        assert {p["name"]: p["state"] for p in status["projections"]}["customer_cache"] \
            == "paused"
        assert client.post("/api/projections/customer_cache/resume").json()["changed"]
        audit = client.get("/api/audit", params={"limit": 3}).json()
        assert [a["action"] for a in audit] == ["resume", "pause", "pause"]
        assert audit[0]["who"].startswith("ada@") and audit[0]["subject"] == "customer_cache"
        assert audit[1]["outcome"].endswith("nothing was changed") and audit[0]["at"]
        missing = client.post("/api/projections/nothing/pause")
        assert missing.status_code == 404 and "nothing" in missing.json()["error"]
    wait_until(lambda: system.projection("customer_cache")["state"] == "running",
               what="the resumed projection")


def test_dead_letters_look_retry_and_drop(system: System) -> None:
    with system.client() as client:
        letters = client.get("/api/dead-letters", params={"projection": "revenue"}).json()
        assert len(letters) == 4 and {d["status"] for d in letters} <= {"open", "resolved"}
        opened = [d for d in letters if d["status"] == "open"]
        one = client.get(f"/api/dead-letters/{opened[0]['id']}").json()
        assert "poison order" in one["error"] and one["record"]
        assert client.get("/api/dead-letters/999999").status_code == 404
        dropped = client.post(f"/api/dead-letters/{opened[-1]['id']}/drop").json()
        assert dropped["changed"] and "dropped" in dropped["message"]
        refused = client.post(f"/api/dead-letters/{opened[-1]['id']}/drop")
        assert refused.status_code == 409 and "not open" in refused.json()["error"]
        assert client.post("/api/dead-letters/999999/retry").status_code == 404


def test_capture_pause_resume_and_resnapshot(system: System) -> None:
    with system.client() as client:
        assert client.post("/api/captures/console/pause").json()["changed"]
        again = client.post("/api/captures/console/pause").json()
        assert not again["changed"] and "already paused" in again["message"]
        wait_until(lambda: system.overview()["captures"][0]["paused"], what="the paused capture")
        assert client.post("/api/captures/console/resume").json()["changed"]
        assert client.post("/api/captures/nothing/pause").status_code == 404
        records = system.overview()["captures"][0]["records"]
        started = client.post("/api/captures/console/resnapshot",
                              json={"tables": ["public.customers"]}).json()
        assert started["changed"] and started["detail"]["tables"] == ["public.customers"]
        assert client.post("/api/captures/console/resnapshot",
                           json={"tables": []}).status_code == 422
    # the re-read rows reach the stream
    wait_until(lambda: system.overview()["captures"][0]["records"] >= records + 30,
               what="the re-snapshot's rows")


def test_rebuild_from_the_console(system: System) -> None:
    with system.client() as client:
        generation = system.projection("customer_cache")["generation"]
        started = client.post("/api/projections/customer_cache/rebuild").json()
        assert started["changed"] and started["detail"]["generation"] == generation + 1
        wait_until(lambda: system.projection("customer_cache")["generation"] == generation + 1,
                   what="the rebuilt generation to switch", timeout=180)
        assert client.get("/api/views/customer_cache/rows",
                          params={"key": "3"}).json()["generation"] == generation + 1


def test_openapi_document_and_history_kept_in_the_store(system: System) -> None:
    with system.client() as client:
        spec = client.get("/openapi.json").json()
        assert {"/api/overview", "/api/history", "/metrics",
                "/api/projections/{name}/pause"} <= set(spec["paths"])
        wait_until(lambda: client.get("/api/history", params={
            "subject": "projection:customer_cache"}).json()["series"],
                   what="history samples")
    # a new console on the same store (a restart) shows the samples written before
    config = ConsoleConfig(store_dsn=system.dsn, roots=SinkRoots.under(system.home),
                           sample_s=3600)
    with ServedApp(config) as other, httpx.Client(base_url=other.url) as client:
        series = client.get("/api/history", params={
            "subject": "projection:customer_cache", "minutes": 60}).json()["series"]
        points = series["projection:customer_cache"]["lag_records"]
        assert len(points) >= 2 and all(len(p) == 2 for p in points)
        # since: only what is newer; a number (pydantic would read epoch seconds) is refused
        last = points[-1][0]
        newer = client.get("/api/history", params={
            "subject": "projection:customer_cache", "since": last}).json()["series"]
        assert all(p[0] > last for s in newer.values() for p in s["lag_records"])
        for bad in ("1700000000", "2026-13-40T00:00:00Z", "yesterday"):
            refused = client.get("/api/history", params={"since": bad})
            assert refused.status_code == 422 and "RFC 3339" in refused.json()["error"], bad


def _described(schema: dict[str, Any], spec: dict[str, Any]) -> bool:
    """Whether ``schema`` says what the answer holds: a model's fields, an array of described
    items, a map of described values, a scalar; not a bare ``object`` (nor nothing)."""
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/components/schemas/")
        return _described(spec["components"]["schemas"][name], spec)
    if "anyOf" in schema:
        return all(_described(s, spec) for s in schema["anyOf"])
    kind = schema.get("type")
    if kind == "array":
        return _described(schema.get("items") or {}, spec)
    if kind == "object":
        values = schema.get("additionalProperties")
        return bool(schema.get("properties")) or (
            isinstance(values, dict) and _described(values, spec))
    return kind in ("string", "integer", "number", "boolean")


def test_every_get_route_describes_its_answer(system: System) -> None:
    with system.client() as client:
        spec = client.get("/openapi.json").json()
    gets = {path: ops["get"] for path, ops in spec["paths"].items() if "get" in ops}
    assert len(gets) >= 14
    vague = []
    for path, op in gets.items():
        content = op["responses"]["200"].get("content") or {}
        if not content:
            vague.append(f"{path}: no content")
        vague += [f"{path} ({media}): {body.get('schema')}" for media, body in content.items()
                  if not _described(body.get("schema") or {}, spec)]
    assert not vague, "answers the document does not describe:\n" + "\n".join(vague)


def test_the_overview_is_what_its_model_says(system: System) -> None:
    """The overview's JSON is encoded once per reading, not through its model: every field
    of it is the model's, of the model's type (a field added to the reading alone fails)."""
    overview = system.overview()
    assert Overview.model_validate(overview).model_dump(mode="json", by_alias=True) == overview
    with system.client() as client:
        one = client.get("/api/projections/city_counts").json()
    assert ProjectionState.model_validate(one).model_dump(mode="json", by_alias=True) == one


def test_a_token_is_required_of_every_request_when_set(system: System) -> None:
    token = "s3cret-" + secrets.token_hex(8)
    config = ConsoleConfig(store_dsn=system.dsn, roots=SinkRoots.under(system.home),
                           token=token)
    with ServedApp(config) as guarded, \
            httpx.Client(base_url=guarded.url) as client:
        for path in ("/api/overview", "/metrics", "/openapi.json", "/static/console.js"):
            response = client.get(path)
            assert response.status_code == 401, path
            assert "needs its token" in response.json()["error"]
        assert client.post("/api/projections/customer_cache/pause",
                           headers={ACTION: "test"}).status_code == 401
        page = client.get("/")
        assert page.status_code == 401 and "<form" in page.text and "s3cret" not in page.text
        bearer = {"Authorization": f"Bearer {token}"}
        assert client.get("/api/overview", headers=bearer).status_code == 200
        assert client.get("/api/overview", headers={
            "Authorization": "Bearer wrong"}).status_code == 401
        login = {ACTION: "login"}
        assert client.post("/login", json={"token": "wrong"}, headers=login).status_code == 401
        assert client.post("/login", json={"token": token}, headers=login).status_code == 204
        assert client.get("/api/overview").status_code == 200  # the cookie it set
        assert "s3cret" not in client.get("/").text


def test_a_non_loopback_address_without_a_token_is_refused() -> None:
    for host in ("127.0.0.1", "localhost", "::1"):
        check_bind(host, None)
    check_bind("0.0.0.0", "a-strong-token-0123456789")  # noqa: S104
    with pytest.raises(ConsoleBindError, match=r"refusing to listen on 0\.0\.0\.0 without a token"):
        check_bind("0.0.0.0", None)  # noqa: S104
    result = CliRunner().invoke(cli_app, ["console", "--host", "0.0.0.0"],  # noqa: S104
                                env={"LAKEFOLD_CONSOLE_TOKEN": ""})
    assert result.exit_code != 0
    assert isinstance(result.exception, ConsoleBindError)
    assert "--token" in str(result.exception)


def test_a_store_that_is_down_gives_503_and_the_console_recovers(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    server = LocalPostgres(tmp_path / "pg", durable=False)
    server.start()
    secret = secrets.token_hex(8)  # trust authentication ignores it; nothing may show it
    try:
        config = ConsoleConfig(store_dsn=f"{server.dsn()} password={secret}",
                               roots=SinkRoots.under(tmp_path), refresh_s=0.3)
        with ServedApp(config) as console, \
                httpx.Client(base_url=console.url, timeout=30) as client:
            wait_until(lambda: client.get("/api/overview").status_code == 200,
                       what="the first reading")
            server.stop()
            down = wait_until(lambda: (r := client.get("/api/overview")).status_code == 503
                              and r, what="503 while the store is down")
            assert down.json()["code"] == "store_unavailable"
            assert "recovers by itself" in down.json()["error"]
            assert secret not in down.text
            assert client.get("/api/audit").status_code == 503
            assert client.post("/api/projections/x/pause",
                               headers={ACTION: "test"}).status_code == 503
            with client.stream("GET", "/api/stream") as events:
                line = next(line for line in events.iter_lines() if line.startswith("data:"))
            assert json.loads(line[5:])["ok"] is False
            metrics = client.get("/metrics").text
            assert "lakefold_console_store_up 0.0" in metrics
            assert secret not in line + metrics + client.get("/").text
            assert any("cannot be read" in r.getMessage() for r in caplog.records)
            assert all(secret not in r.getMessage() for r in caplog.records)
            server.start()
            wait_until(lambda: client.get("/api/overview").status_code == 200,
                       what="the console to recover by itself")
    finally:
        server.stop()
