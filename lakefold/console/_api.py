"""The console's HTTP API (FastAPI; its OpenAPI document at ``/openapi.json``), the page at
``/`` and ``/metrics``. The page uses only this API. ``create_app`` puts the routers of
``_routes`` behind the gate (``_guard``) and the error handlers below.

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
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path as FilePath
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from lakefold.console._actions import Actions
from lakefold.console._guard import ACTION_HEADER, Guard
from lakefold.console._models import ErrorBody
from lakefold.console._monitor import Monitor
from lakefold.console._routes import (
    Served,
    action_routes,
    content_routes,
    error as _error,
    metrics_routes,
    state_routes,
)
from lakefold.console._sessions import COOKIE
from lakefold.console.exceptions import ConsoleNotFoundError
from lakefold.core.dsn import error_text
from lakefold.core.exceptions import LakefoldError, TransientError
from lakefold.projections.exceptions import ProjectionNotFoundError

STATIC = FilePath(__file__).with_name("static")

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


def _problem(error: Any) -> str:
    """One validation error as ``where: what``, without the input it was about."""
    where = ".".join(str(p) for p in error.get("loc", ()) if len(str(p)) <= 40)
    return f"{where}: {error.get('msg', 'invalid')}"


def create_app(monitor: Monitor, actions: Actions, *, allowed_hosts: frozenset[str],
               token: str | None = None, redis_url: str | None = None,
               closing: threading.Event | None = None) -> FastAPI:
    """The console's ASGI application over a monitor (started and stopped with the app) and
    the actions, behind the gate (``_guard``) that answers only to ``allowed_hosts`` (and IP
    addresses), and to every request only with ``token`` when one is set. ``closing``, once
    set (the server is stopping), ends the event streams."""
    served = Served(monitor, actions, token=token or None, redis_url=redis_url,
                    closing=closing or threading.Event())

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
    app.openapi = _document(app, token)  # type: ignore[method-assign]
    _handle_errors(app)

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    for routes in (state_routes, content_routes, metrics_routes, action_routes):
        app.include_router(routes(served))
    return app


def _document(app: FastAPI, token: str | None) -> Callable[[], dict[str, Any]]:
    """``app.openapi``: the document, made once, with the security schemes when a token is
    required."""

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

    return openapi


def _handle_errors(app: FastAPI) -> None:
    """Every error as ``ErrorBody`` JSON, with the status the module docstring lists."""

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
