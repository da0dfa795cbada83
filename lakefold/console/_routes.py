"""The console's routes, one router per area, each answering with a model of ``_models``:

- ``state_routes``: what the console is, the overview (as JSON and as server-sent events), the
  history of lag and throughput, one projection;
- ``content_routes``: looking inside changelog streams, event categories, dead letters, a
  view's rows, and the audit of actions;
- ``metrics_routes``: ``/metrics`` for Prometheus;
- ``action_routes``: pause, resume and rebuild of projections, retry and drop of dead letters,
  pause, resume and re-snapshot of captures (each audited; the header ``X-Lakefold-Request``
  is required).

``create_app`` (``_api``) puts them behind the gate and the error handlers.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import threading
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Path, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from lakefold.console._actions import Actions, read_audit
from lakefold.console._guard import ACTION_HEADER
from lakefold.console._history import read_history
from lakefold.console._metrics import exposition, metrics_registry
from lakefold.console._models import (
    NO_NUL,
    ActionResult,
    AuditEntry,
    Batch,
    CaptureState,
    CategoryEvents,
    ConsoleInfo,
    DeadLetter,
    History,
    Overview,
    ProjectionState,
    Resnapshot,
    StreamInfo,
    StreamRecords,
    Text,
    ViewRows,
)
from lakefold.console._monitor import Monitor
from lakefold.console._peek import (
    category_events,
    dead_letter,
    json_safe,
    stream_records,
    view_rows,
)
from lakefold.console.exceptions import ConsoleNotFoundError
from lakefold.projections import DeadLetters

_OPERATOR_HEADER = "x-lakefold-operator"

#: An RFC 3339 time, as the document's ``format: date-time`` says: numbers, which pydantic
#: would read as seconds since the epoch, are refused.
RFC3339 = re.compile(r"(\d{4}-\d\d-\d\d)[Tt ](\d\d:\d\d:\d\d)(?:\.(\d+))?([Zz]|[+-]\d\d:\d\d)")

Name = Annotated[str, Path(pattern=NO_NUL)]
#: Every action carries this header: no form, and no cross-site fetch without a CORS
#: pre-flight (never granted), can send it.
ActionHeader = Annotated[str, Header(
    alias=ACTION_HEADER, min_length=1,
    description="Any value: the mark of a request sent by a script of the console's own "
                "origin (a cross-site form cannot send it).")]


@dataclass(frozen=True)
class Served:
    """What the routes serve: the monitor's readings, the actions, the Redis of cache views,
    and ``closing``, set when the server stops (it ends the event streams)."""

    monitor: Monitor
    actions: Actions
    token: str | None
    redis_url: str | None
    closing: threading.Event


def error(status: int, text: str, code: str) -> JSONResponse:
    """An error answer (``ErrorBody``)."""
    return JSONResponse({"error": text, "code": code}, status_code=status)


def _unreadable(monitor: Monitor) -> JSONResponse:
    return error(503, f"the store cannot be read: {monitor.reading.error}; the console "
                      "retries every interval and recovers by itself", "store_unavailable")


def _one(monitor: Monitor, part: str, field: str, value: str, missing: str) -> Any:
    """The entry of the overview's ``part`` whose ``field`` is ``value`` (503 while the store
    cannot be read; 404 saying ``missing`` when there is none)."""
    found = monitor.reading.overview
    if found is None:
        return _unreadable(monitor)
    for entry in found[part]:
        if entry[field] == value:
            return entry
    raise ConsoleNotFoundError(f"{missing} {value!r}; GET /api/overview lists them")


def _rfc3339(text: str) -> dt.datetime | None:
    """``text`` as an aware time, or None when it is not an RFC 3339 time."""
    found = RFC3339.fullmatch(text)
    if found is None:
        return None
    day, clock, fraction, offset = found.groups()
    offset = "+00:00" if offset in "Zz" else offset
    try:
        return dt.datetime.fromisoformat(f"{day}T{clock}.{(fraction or '0')[:6]:0<6}{offset}")
    except ValueError:
        return None


def _who(request: Request) -> str:
    """Who acts: the name the page sends (``X-Lakefold-Operator``), and from where."""
    name = (request.headers.get(_OPERATOR_HEADER) or "anonymous").strip()[:80] or "anonymous"
    host = request.client.host if request.client else "unknown"
    return f"{name}@{host}"


# ------------------------------------------------------------------ state

def state_routes(served: Served) -> APIRouter:
    """The console, the overview (JSON and server-sent events), history, one projection."""
    router = APIRouter()
    monitor, closing = served.monitor, served.closing

    @router.get("/api/console", response_model=ConsoleInfo,
                summary="What this console is: whether it needs a token (the page offers "
                        "'log out'), whether it can rebuild")
    async def about() -> dict[str, bool]:
        return {"token_required": bool(served.token),
                "can_rebuild": served.actions.projections is not None}

    @router.get("/api/overview", response_model=Overview,
                summary="Captures, the event store, projections, views, the DAG")
    async def overview() -> Response:
        # The reading's JSON, made once per reading: a poll costs no encoding (and no thread).
        reading = monitor.reading
        if reading.overview is None:
            return _unreadable(monitor)
        return Response(reading.body, media_type="application/json")

    @router.get("/api/stream", summary="The overview as server-sent events (event: overview)",
                response_class=StreamingResponse,
                responses={200: {"description": "``event: overview`` messages whose data is "
                                                "``{\"ok\": true, \"overview\": Overview}`` or "
                                                "``{\"ok\": false, \"error\": ...}``, and "
                                                "keep-alive comments",
                                 "content": {"text/event-stream": {
                                     "schema": {"type": "string"}}}}})
    async def stream(request: Request) -> StreamingResponse:
        async def events() -> AsyncIterator[str]:
            last = -1
            quiet = 0.0
            while not closing.is_set() and not await request.is_disconnected():
                reading = monitor.reading
                if reading.version != last:
                    last = reading.version
                    quiet = 0.0
                    data = '{"ok": true, "overview": ' + reading.body.decode() + "}" \
                        if reading.overview is not None else json.dumps(
                            {"ok": False, "error": f"the store cannot be read: {reading.error}"})
                    yield f"event: overview\ndata: {data}\n\n"
                elif quiet > 15:
                    quiet = 0.0
                    yield ": keep-alive\n\n"
                await asyncio.sleep(0.25)
                quiet += 0.25

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"})

    @router.get("/api/history", response_model=History,
                summary="Sampled lag and throughput, from the store")
    def history(subject: Annotated[str | None, Query(max_length=300, pattern=NO_NUL)] = None,
                minutes: Annotated[float, Query(gt=0, le=7 * 24 * 60)] = 180.0,
                since: Annotated[str | None, Query(
                    max_length=64, json_schema_extra={"format": "date-time"},
                    description="Only samples after this time (RFC 3339; the last one a page "
                                "has): a page fetches the history once, then what is new.")
                ] = None) -> Any:
        after = None if since is None else _rfc3339(since)
        if since is not None and after is None:
            return error(422, "since is not a time; give an RFC 3339 time such as "
                              "2026-11-28T12:00:00Z", "invalid_request")
        return {"minutes": minutes, "series": read_history(
            monitor.addresses.store_dsn, subject=subject, minutes=minutes, since=after)}

    @router.get("/api/projections/{name}", response_model=ProjectionState,
                summary="One projection or view, as in the overview")
    def projection(name: Name) -> Any:
        return _one(monitor, "projections", "name", name, "no projection or view named")

    @router.get("/api/projections/{name}/batches", response_model=list[Batch],
                summary="The last committed batches of a projection or view, newest first")
    def batches(name: Name, limit: Annotated[int, Query(ge=1, le=500)] = 20) -> Any:
        catalog = monitor.catalog
        catalog.projection(name)  # an unknown name: 404 (ProjectionNotFoundError)
        return [json_safe(b) for b in catalog.recent_batches(name, limit=limit)]

    @router.get("/api/captures/{slot}", response_model=CaptureState,
                summary="One capture, as in the overview")
    def capture(slot: Name) -> Any:
        return _one(monitor, "captures", "slot", slot, "no capture with slot")

    return router


# ------------------------------------------------------------------ contents

def content_routes(served: Served) -> APIRouter:
    """Looking inside: streams and their records, categories and their events, dead letters,
    a view's rows for one key, the audit."""
    router = APIRouter()
    store_dsn = served.monitor.addresses.store_dsn
    catalog = served.monitor.catalog

    @router.get("/api/streams", response_model=list[StreamInfo],
                summary="The changelog streams (name, slot, head, schema)")
    def streams() -> Any:
        from lakefold.capture import ChangelogStore

        with ChangelogStore(store_dsn) as store:
            return [json_safe(asdict(s)) for s in store.streams()]

    @router.get("/api/streams/{stream}/records", response_model=StreamRecords,
                summary="Latest records of a changelog stream, newest first")
    def records(stream: Name, before: Annotated[int | None, Query(ge=1)] = None,
                limit: Annotated[int, Query(ge=1, le=500)] = 20) -> Any:
        return stream_records(store_dsn, stream, before=before, limit=limit)

    @router.get("/api/categories", response_model=list[str], summary="The event categories")
    def categories() -> Any:
        from lakefold.eventstore import list_categories

        return list_categories(store_dsn)

    @router.get("/api/categories/{category}/events", response_model=CategoryEvents,
                summary="Latest events of a category, newest first")
    def events(category: Name, before: Annotated[int | None, Query(ge=1)] = None,
               limit: Annotated[int, Query(ge=1, le=500)] = 20) -> Any:
        return category_events(store_dsn, category, before=before, limit=limit)

    @router.get("/api/dead-letters", response_model=list[DeadLetter],
                summary="Dead letters, newest first")
    def dead_letters(projection: Annotated[str | None, Query(max_length=300,
                                                             pattern=NO_NUL)] = None,
                     status: Annotated[str | None, Query(
                         pattern="^(open|retry|resolved|dropped)$")] = None,
                     limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> Any:
        found = DeadLetters(catalog).find(projection, status=status, limit=limit)
        return [json_safe(d.as_json()) for d in found]

    @router.get("/api/dead-letters/{letter_id}", response_model=DeadLetter,
                summary="One dead letter: record and error")
    def one_dead_letter(letter_id: int) -> Any:
        return dead_letter(catalog, letter_id)

    @router.get("/api/views/{name}/rows", response_model=ViewRows,
                summary="A view's rows for one key (its target's)")
    def rows(name: Name, key: Annotated[list[Text], Query(min_length=1)]) -> Any:
        return view_rows(catalog, name, key, redis_url=served.redis_url)

    @router.get("/api/audit", response_model=list[AuditEntry],
                summary="The actions taken from the console, newest first")
    def audit(limit: Annotated[int, Query(ge=1, le=1000)] = 50) -> Any:
        return read_audit(store_dsn, limit=limit)

    return router


# ------------------------------------------------------------------ metrics

def metrics_routes(served: Served) -> APIRouter:
    """``/metrics``: the overview in Prometheus' text format."""
    router = APIRouter()
    registry = metrics_registry(served.monitor)

    @router.get("/metrics", summary="Prometheus metrics (names prefixed lakefold_)",
                response_class=Response,
                responses={200: {"description": "Prometheus' text exposition format",
                                 "content": {"text/plain": {"schema": {"type": "string"}}}}})
    def metrics() -> Response:
        return Response(exposition(registry),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    return router


# ------------------------------------------------------------------ acting

def action_routes(served: Served) -> APIRouter:
    """The actions; each is audited, and the overview is read again right after."""
    router = APIRouter()
    monitor, actions = served.monitor, served.actions

    def done(outcome: Any) -> ActionResult:
        monitor.refresh_soon()
        return ActionResult(**outcome.as_json())

    @router.post("/api/projections/{name}/pause", summary="Pause a projection or view")
    def pause(name: Name, request: Request, _mark: ActionHeader) -> ActionResult:
        return done(actions.set_paused(_who(request), name, True))

    @router.post("/api/projections/{name}/resume", summary="Resume a projection or view")
    def resume(name: Name, request: Request, _mark: ActionHeader) -> ActionResult:
        return done(actions.set_paused(_who(request), name, False))

    @router.post("/api/projections/{name}/rebuild",
                 summary="Rebuild into a new generation (a running `lakefold run` switches)")
    def rebuild(name: Name, request: Request, _mark: ActionHeader) -> ActionResult:
        return done(actions.rebuild(_who(request), name))

    @router.post("/api/dead-letters/{letter_id}/retry", summary="Retry an open dead letter")
    def retry(letter_id: int, request: Request, _mark: ActionHeader) -> ActionResult:
        return done(actions.dead_letter(_who(request), letter_id, retry=True))

    @router.post("/api/dead-letters/{letter_id}/drop", summary="Drop an open dead letter")
    def drop(letter_id: int, request: Request, _mark: ActionHeader) -> ActionResult:
        return done(actions.dead_letter(_who(request), letter_id, retry=False))

    @router.post("/api/captures/{slot}/pause", summary="Pause a capture's streaming")
    def pause_capture(slot: Name, request: Request, _mark: ActionHeader) -> ActionResult:
        return done(actions.set_capture_paused(_who(request), slot, True))

    @router.post("/api/captures/{slot}/resume", summary="Resume a paused capture")
    def resume_capture(slot: Name, request: Request, _mark: ActionHeader) -> ActionResult:
        return done(actions.set_capture_paused(_who(request), slot, False))

    @router.post("/api/captures/{slot}/resnapshot",
                 summary="Re-read tables into their streams (in the background)")
    def resnapshot(slot: Name, request: Request, body: Annotated[Resnapshot, Body()],
                   _mark: ActionHeader) -> ActionResult:
        return done(actions.resnapshot(_who(request), slot, body.tables))

    return router
