"""The operations console: a web page, an HTTP API (OpenAPI at ``/openapi.json``) and
Prometheus metrics (``/metrics``) for captures, the event store, projections and views.

``lakefold console [--host 127.0.0.1] [--port N] [--token T]`` serves it (``serve``);
``build_app(ConsoleConfig(...))`` gives the ASGI application for tests and embedding.

Inside: the overview read from the stores (``_overview``), the background reader that keeps
the latest one and the history samples (``_monitor``, ``_history``), the actions and their
audit (``_actions``), looking inside streams, categories, dead letters and views (``_peek``),
``/metrics`` (``_metrics``), the token and the listening address (``_access``), the
application behind its gate and error handlers (``_api``), its routes in one router per area
(``_routes``) answering with the models of ``_models`` (so ``/openapi.json`` describes every
answer), the server (``_server``), and the page (``static/``: plain HTML, CSS and JS, no CDN;
it works offline).
"""

from lakefold.console._access import check_bind, is_loopback
from lakefold.console._metrics import METRICS
from lakefold.console._server import ConsoleConfig, build_app, install, serve
from lakefold.console.exceptions import (
    ConsoleBindError,
    ConsoleError,
    ConsoleNotFoundError,
    ConsoleRequestError,
)

__all__ = [
    "METRICS",
    "ConsoleBindError",
    "ConsoleConfig",
    "ConsoleError",
    "ConsoleNotFoundError",
    "ConsoleRequestError",
    "build_app",
    "check_bind",
    "install",
    "is_loopback",
    "serve",
]
