"""The console's HTTP API (FastAPI; its OpenAPI document at ``/openapi.json``), the page at
``/`` and ``/metrics``. The page uses only this API.

Errors are JSON ``{"error": ..., "code": ...}``: 404 for an unknown projection, stream,
category, dead letter or capture; 409 for what cannot be done as asked; 503 while the store
cannot be reached (the monitor keeps trying; the console recovers by itself); 401 without the
token when one is set, 403 for a request from another origin or without the header
``X-Lakefold-Request``, 400 for a foreign ``Host`` or a NUL byte, 429 after too many wrong
tokens (``_guard``); 422 for a request that does not match this document (naming the field and
what is wrong with it, never echoing the input).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path as FilePath
from typing import Annotated, Any

import psycopg
from fastapi import Body, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field, StringConstraints
from starlette.exceptions import HTTPException as StarletteHTTPException

from lakefold.console._actions import Actions, read_audit
from lakefold.console._guard import ACTION_HEADER, Guard
from lakefold.console._history import read_history
from lakefold.console._metrics import exposition, metrics_registry
from lakefold.console._monitor import Monitor
from lakefold.console._peek import (
    category_events,
    dead_letter,
    json_safe,
    stream_records,
    view_rows,
)
from lakefold.console._sessions import COOKIE
from lakefold.console.exceptions import ConsoleNotFoundError
from lakefold.core.dsn import error_text
from lakefold.core.exceptions import LakefoldError, TransientError
from lakefold.projections import DeadLetters
from lakefold.projections.exceptions import ProjectionNotFoundError

STATIC = FilePath(__file__).with_name("static")
_OPERATOR_HEADER = "x-lakefold-operator"


class ErrorBody(BaseModel):
    """An error: what was wrong and what to do, and a stable code."""

    error: str
    code: str


class ActionResult(BaseModel):
    """What an action did (``changed`` false: it already was so) and its audit row."""

    action: str
    subject: str
    changed: bool
    message: str
    audit_id: int
    detail: dict[str, Any]


#: No name in lakefold holds a NUL byte (PostgreSQL text cannot): the document says so, and
#: the gate (``_guard``) answers 400 to a path or query that holds one.
NO_NUL = r"^[^\x00]*$"
#: An RFC 3339 time, as the document's ``format: date-time`` says: numbers, which pydantic
#: would read as seconds since the epoch, are refused.
RFC3339 = re.compile(r"(\d{4}-\d\d-\d\d)[Tt ](\d\d:\d\d:\d\d)(?:\.(\d+))?([Zz]|[+-]\d\d:\d\d)")


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


Name = Annotated[str, Path(pattern=NO_NUL)]
Text = Annotated[str, StringConstraints(pattern=NO_NUL)]


class Resnapshot(BaseModel):
    """Tables (``schema.table``) of the capture to read again."""

    tables: list[Text] = Field(min_length=1)


_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "A foreign Host, or a NUL byte in a name."},
    401: {"model": ErrorBody, "description": "The token is missing or wrong."},
    403: {"model": ErrorBody, "description": "An action from another origin, or without the "
                                             f"header {ACTION_HEADER}."},
    404: {"model": ErrorBody, "description": "No such thing."},
    409: {"model": ErrorBody, "description": "It cannot be done as asked."},
    422: {"model": ErrorBody, "description": "The request does not match this document."},
    429: {"model": ErrorBody, "description": "Too many wrong tokens from this address."},
    503: {"model": ErrorBody, "description": "The store cannot be reached."},
}
#: Every action carries this header: no form, and no cross-site fetch without a CORS
#: pre-flight (never granted), can send it.
ActionHeader = Annotated[str, Header(
    alias=ACTION_HEADER, min_length=1,
    description="Any value: the mark of a request sent by a script of the console's own "
                "origin (a cross-site form cannot send it).")]


def _problem(error: Any) -> str:
    """One validation error as ``where: what``, without the input it was about."""
    where = ".".join(str(p) for p in error.get("loc", ()) if len(str(p)) <= 40)
    return f"{where}: {error.get('msg', 'invalid')}"


def _error(status: int, text: str, code: str) -> JSONResponse:
    return JSONResponse({"error": text, "code": code}, status_code=status)


def _who(request: Request) -> str:
    """Who acts: the name the page sends (``X-Lakefold-Operator``), and from where."""
    name = (request.headers.get(_OPERATOR_HEADER) or "anonymous").strip()[:80] or "anonymous"
    host = request.client.host if request.client else "unknown"
    return f"{name}@{host}"


def create_app(monitor: Monitor, actions: Actions, *, allowed_hosts: frozenset[str],
               token: str | None = None, redis_url: str | None = None,
               closing: threading.Event | None = None) -> FastAPI:
    """The console's ASGI application over a monitor (started and stopped with the app) and
    the actions, behind the gate (``_guard``) that answers only to ``allowed_hosts`` (and IP
    addresses), and to every request only with ``token`` when one is set. ``closing``, once
    set (the server is stopping), ends the event streams."""
    closing = closing or threading.Event()
    store_dsn = monitor.addresses.store_dsn
    catalog = monitor.catalog
    registry = metrics_registry(monitor)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(monitor.start)
        try:
            yield
        finally:
            await asyncio.to_thread(monitor.stop)

    app = FastAPI(title="lakefold console", version="1", docs_url=None, redoc_url=None,
                  lifespan=lifespan, responses=_ERRORS,
                  description="Captures, the event store, projections and views: their "
                              "state, history, contents, and actions on them.")
    app.add_middleware(Guard, allowed_hosts=allowed_hosts, token=token or None)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version,
                                 description=app.description, routes=app.routes)
            if token:  # what this console asks of every request
                schema.setdefault("components", {})["securitySchemes"] = {
                    "bearer": {"type": "http", "scheme": "bearer",
                               "description": "The console's token."},
                    "session": {"type": "apiKey", "in": "cookie", "name": COOKIE,
                                "description": "The session POST /login starts."}}
                schema["security"] = [{"bearer": []}, {"session": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: Exception) -> JSONResponse:
        assert isinstance(e, RequestValidationError)  # noqa: S101 - registered for it
        problems = "; ".join(_problem(error) for error in e.errors()[:5])
        return _error(422, f"invalid request: {problems}"[:1000], "invalid_request")

    @app.exception_handler(psycopg.DataError)
    async def bad_value(_: Request, e: Exception) -> JSONResponse:
        return _error(400, "a value in the request cannot be stored or looked up in "
                           "PostgreSQL", "bad_request")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: Exception) -> JSONResponse:
        assert isinstance(e, StarletteHTTPException)  # noqa: S101 - registered for it
        code = {400: "bad_request", 404: "not_found", 405: "method_not_allowed"}
        response = _error(e.status_code, str(e.detail), code.get(e.status_code, "http_error"))
        response.headers.update(e.headers or {})  # e.g. Allow of a 405
        return response

    @app.exception_handler(ConsoleNotFoundError)
    @app.exception_handler(ProjectionNotFoundError)
    async def not_found(_: Request, e: Exception) -> JSONResponse:
        return _error(404, str(e), "not_found")

    @app.exception_handler(TransientError)
    async def unavailable(_: Request, e: Exception) -> JSONResponse:
        return _error(503, str(e), "store_unavailable")

    @app.exception_handler(psycopg.OperationalError)
    async def store_down(_: Request, e: Exception) -> JSONResponse:
        assert isinstance(e, psycopg.Error)  # noqa: S101 - registered for it
        return _error(503, f"the store cannot be reached ({error_text(e)}); the console "
                           "retries by itself", "store_unavailable")

    @app.exception_handler(LakefoldError)
    async def refused(_: Request, e: Exception) -> JSONResponse:
        return _error(409, str(e), "refused")

    def overview_or_503() -> dict[str, Any] | JSONResponse:
        reading = monitor.reading
        if reading.overview is None:
            return _error(503, f"the store cannot be read: {reading.error}; the console "
                               "retries every interval and recovers by itself",
                          "store_unavailable")
        return reading.overview

    # ------------------------------------------------------------------ page

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    # ------------------------------------------------------------------ reading

    @app.get("/api/console", summary="What this console is: whether it needs a token (the "
                                     "page offers 'log out'), whether it can rebuild")
    async def about() -> dict[str, bool]:
        return {"token_required": bool(token), "can_rebuild": actions.projections is not None}

    @app.get("/api/overview", summary="Captures, the event store, projections, views, the DAG",
             response_class=Response,
             responses={200: {"content": {"application/json": {"schema": {"type": "object"}}}}})
    async def overview() -> Response:
        # The reading's JSON, made once per reading: a poll costs no encoding (and no thread).
        reading = monitor.reading
        if reading.overview is None:
            return _error(503, f"the store cannot be read: {reading.error}; the console "
                               "retries every interval and recovers by itself",
                          "store_unavailable")
        return Response(reading.body, media_type="application/json")

    @app.get("/api/stream", summary="The overview as server-sent events (event: overview)",
             response_class=StreamingResponse,
             responses={200: {"content": {"text/event-stream": {}}}})
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

    @app.get("/api/history", summary="Sampled lag and throughput, from the store")
    def history(subject: Annotated[str | None, Query(max_length=300, pattern=NO_NUL)] = None,
                minutes: Annotated[float, Query(gt=0, le=7 * 24 * 60)] = 180.0,
                since: Annotated[str | None, Query(
                    max_length=64, json_schema_extra={"format": "date-time"},
                    description="Only samples after this time (RFC 3339; the last one a page "
                                "has): a page fetches the history once, then what is new.")
                ] = None) -> Any:
        after = None if since is None else _rfc3339(since)
        if since is not None and after is None:
            return _error(422, "since is not a time; give an RFC 3339 time such as "
                               "2026-11-28T12:00:00Z", "invalid_request")
        return {"minutes": minutes, "series": read_history(store_dsn, subject=subject,
                                                           minutes=minutes, since=after)}

    @app.get("/api/projections/{name}", summary="One projection or view, as in the overview")
    def projection(name: Name) -> Any:
        found = overview_or_503()
        if isinstance(found, JSONResponse):
            return found
        for entry in found["projections"]:
            if entry["name"] == name:
                return entry
        raise ConsoleNotFoundError(f"no projection or view named {name!r}; "
                                   "GET /api/overview lists them")

    @app.get("/api/streams", summary="The changelog streams (name, slot, head, schema)")
    def streams() -> Any:
        from lakefold.capture import ChangelogStore

        with ChangelogStore(store_dsn) as store:
            return [json_safe(asdict(s)) for s in store.streams()]

    @app.get("/api/streams/{stream}/records",
             summary="Latest records of a changelog stream, newest first")
    def records(stream: Name, before: Annotated[int | None, Query(ge=1)] = None,
                limit: Annotated[int, Query(ge=1, le=500)] = 20) -> Any:
        return stream_records(store_dsn, stream, before=before, limit=limit)

    @app.get("/api/categories", summary="The event categories")
    def categories() -> Any:
        from lakefold.eventstore import list_categories

        return list_categories(store_dsn)

    @app.get("/api/categories/{category}/events",
             summary="Latest events of a category, newest first")
    def events(category: Name, before: Annotated[int | None, Query(ge=1)] = None,
               limit: Annotated[int, Query(ge=1, le=500)] = 20) -> Any:
        return category_events(store_dsn, category, before=before, limit=limit)

    @app.get("/api/dead-letters", summary="Dead letters, newest first")
    def dead_letters(projection: Annotated[str | None, Query(max_length=300,
                                                             pattern=NO_NUL)] = None,
                     status: Annotated[str | None, Query(
                         pattern="^(open|retry|resolved|dropped)$")] = None,
                     limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> Any:
        found = DeadLetters(catalog).find(projection, status=status, limit=limit)
        return [json_safe(d.as_json()) for d in found]

    @app.get("/api/dead-letters/{letter_id}", summary="One dead letter: record and error")
    def one_dead_letter(letter_id: int) -> Any:
        return dead_letter(catalog, letter_id)

    @app.get("/api/views/{name}/rows", summary="A view's rows for one key (its target's)")
    def rows(name: Name, key: Annotated[list[Text], Query(min_length=1)]) -> Any:
        return view_rows(catalog, name, key, redis_url=redis_url)

    @app.get("/api/audit", summary="The actions taken from the console, newest first")
    def audit(limit: Annotated[int, Query(ge=1, le=1000)] = 50) -> Any:
        return read_audit(store_dsn, limit=limit)

    @app.get("/metrics", summary="Prometheus metrics (names prefixed lakefold_)",
             response_class=Response,
             responses={200: {"content": {"text/plain": {}}}})
    def metrics() -> Response:
        return Response(exposition(registry),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    # ------------------------------------------------------------------ acting

    def done(outcome: Any) -> ActionResult:
        monitor.refresh_soon()
        return ActionResult(**outcome.as_json())

    @app.post("/api/projections/{name}/pause", summary="Pause a projection or view")
    def pause(name: Name, request: Request, _mark: ActionHeader) -> ActionResult:
        return done(actions.set_paused(_who(request), name, True))

    @app.post("/api/projections/{name}/resume", summary="Resume a projection or view")
    def resume(name: Name, request: Request, _mark: ActionHeader) -> ActionResult:
        return done(actions.set_paused(_who(request), name, False))

    @app.post("/api/projections/{name}/rebuild",
              summary="Rebuild into a new generation (a running `lakefold run` switches)")
    def rebuild(name: Name, request: Request, _mark: ActionHeader) -> ActionResult:
        return done(actions.rebuild(_who(request), name))

    @app.post("/api/dead-letters/{letter_id}/retry", summary="Retry an open dead letter")
    def retry(letter_id: int, request: Request, _mark: ActionHeader) -> ActionResult:
        return done(actions.dead_letter(_who(request), letter_id, retry=True))

    @app.post("/api/dead-letters/{letter_id}/drop", summary="Drop an open dead letter")
    def drop(letter_id: int, request: Request, _mark: ActionHeader) -> ActionResult:
        return done(actions.dead_letter(_who(request), letter_id, retry=False))

    @app.post("/api/captures/{slot}/pause", summary="Pause a capture's streaming")
    def pause_capture(slot: Name, request: Request, _mark: ActionHeader) -> ActionResult:
        return done(actions.set_capture_paused(_who(request), slot, True))

    @app.post("/api/captures/{slot}/resume", summary="Resume a paused capture")
    def resume_capture(slot: Name, request: Request, _mark: ActionHeader
                       ) -> ActionResult:
        return done(actions.set_capture_paused(_who(request), slot, False))

    @app.post("/api/captures/{slot}/resnapshot",
              summary="Re-read tables into their streams (in the background)")
    def resnapshot(slot: Name, request: Request, body: Annotated[Resnapshot, Body()],
                   _mark: ActionHeader) -> ActionResult:
        return done(actions.resnapshot(_who(request), slot, body.tables))

    return app
