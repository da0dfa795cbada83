"""``lakefold console``: build the console over a store and serve it with uvicorn."""

from __future__ import annotations

import datetime as dt
import threading
from dataclasses import dataclass
from types import FrameType

from fastapi import FastAPI

from lakefold.console._access import allowed_hosts, check_bind
from lakefold.console._actions import Actions
from lakefold.console._api import create_app
from lakefold.console._monitor import Monitor, install_store
from lakefold.console._overview import StoreAddresses
from lakefold.projections.operations import Catalog, SinkRoots


@dataclass(frozen=True)
class ConsoleConfig:
    """What the console reads and how it serves.

    ``store_dsn``: lakefold's store; ``source_dsn``: the captures' source database (None: the
    store's); ``redis_url``: for rows of Redis cache views; ``roots``: where generations'
    sinks live; ``projections``: the projections module (needed only to rebuild);
    ``refresh_s``: how often the overview is read; ``sample_s``: how often a history sample
    is stored; ``keep_hours``: how long samples are kept; ``token``: required of every
    request when set; ``allow_hosts``: names besides its own address and ``localhost`` that
    the console answers to (the name a reverse proxy or DNS gives it).
    """

    store_dsn: str
    roots: SinkRoots
    source_dsn: str | None = None
    redis_url: str | None = None
    projections: str | None = None
    refresh_s: float = 1.0
    sample_s: float = 10.0
    keep_hours: float = 24.0
    token: str | None = None
    allow_hosts: tuple[str, ...] = ()


def build_app(config: ConsoleConfig, *, host: str = "127.0.0.1",
              closing: threading.Event | None = None) -> FastAPI:
    """The console's application (its monitor starts with it), answering to the names of
    ``host`` (the address it listens on) and ``config.allow_hosts``; setting ``closing`` ends
    its event streams (``serve`` sets it when the server is asked to stop)."""
    catalog = Catalog(config.store_dsn, config.roots)
    monitor = Monitor(catalog, StoreAddresses(config.store_dsn, config.source_dsn),
                      refresh_s=config.refresh_s, sample_s=config.sample_s,
                      keep=dt.timedelta(hours=config.keep_hours))
    actions = Actions(catalog, config.store_dsn, config.source_dsn,
                      projections=config.projections)
    return create_app(monitor, actions, allowed_hosts=allowed_hosts(host, config.allow_hosts),
                      token=config.token, redis_url=config.redis_url, closing=closing)


def install(config: ConsoleConfig) -> None:
    """The tables the console reads and writes (``install_store``); the monitor also does
    this at its first reading, when the store is up."""
    with Catalog(config.store_dsn, config.roots) as catalog:
        install_store(catalog)


def serve(config: ConsoleConfig, *, host: str = "127.0.0.1", port: int = 8470) -> None:
    """Serve the console until interrupted. A non-loopback ``host`` without a token is
    refused (ConsoleBindError) before anything listens."""
    import uvicorn

    check_bind(host, config.token)
    install(config)
    closing = threading.Event()

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            closing.set()  # open event streams end, so the shutdown need not wait for them
            super().handle_exit(sig, frame)

    Server(uvicorn.Config(build_app(config, host=host, closing=closing), host=host, port=port,
                          log_level="warning", access_log=False, server_header=False,
                          timeout_graceful_shutdown=5)).run()
