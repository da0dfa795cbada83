"""``lakefold console``: the operations console (a web page, the JSON API, /metrics)."""

from __future__ import annotations

import errno
import socket
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from lakefold.cli._common import app
from lakefold.core.exceptions import ConfigurationError

_err = Console(stderr=True)


def _check_port_free(host: str, port: int) -> None:
    """ConfigurationError (one line) when ``host:port`` cannot be listened on, before the
    console announces its address."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ConfigurationError(
                    f"port {port} on {host} is taken by another program (another console?); "
                    "pass --port N, or stop the other one") from None
            raise ConfigurationError(f"cannot listen on {host}:{port}: {e.strerror}") from None


@app.command("console")
def console(
    host: Annotated[str, typer.Option(
        help="Address to listen on. Any but a loopback one needs a token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8470,
    token_file: Annotated[Path | None, typer.Option(
        help="File holding the token every request must carry (its one line; default: "
             "LAKEFOLD_CONSOLE_TOKEN_FILE, then LAKEFOLD_CONSOLE_TOKEN).",
        show_default=False)] = None,
    token: Annotated[str | None, typer.Option(
        help="The token itself; other users of the machine see it in ps: prefer "
             "--token-file.", show_default=False)] = None,
    allow_host: Annotated[list[str] | None, typer.Option(
        help="Another name the console answers to (a reverse proxy's or DNS name; "
             "repeatable). It always answers to its address, localhost and IP addresses.",
        show_default=False)] = None,
    projections: Annotated[str | None, typer.Option(
        "--projections", "-p", help="The projections module (needed to rebuild from the "
        "console; default: the `projections` setting).", show_default=False)] = None,
    refresh: Annotated[float, typer.Option(
        min=0.2, help="Seconds between readings of the stores.")] = 1.0,
) -> None:
    """Serve the operations console: overview, history, the DAG, a look inside streams and
    views, and actions (pause, resume, rebuild, dead letters, re-snapshot)."""
    from lakefold.console import ConsoleConfig, check_bind, serve
    from lakefold.console._access import token_from
    from lakefold.core.dsn import dsn_address
    from lakefold.projections.operations import SinkRoots
    from lakefold.settings import load_settings

    settings = load_settings()
    token = token_from(token, token_file or settings.console_token_file,
                       settings.console_token.get_secret_value()
                       if settings.console_token else None)
    check_bind(host, token)  # before anything else: a refused start changes nothing
    store_dsn = settings.resolved_store_dsn()
    if not store_dsn:
        raise ConfigurationError(
            "no store DSN: set LAKEFOLD_STORE_DSN (or LAKEFOLD_DSN) to the PostgreSQL database "
            "that holds lakefold's schema")
    config = ConsoleConfig(
        store_dsn=store_dsn, roots=SinkRoots.under(settings.home, settings.lake_location),
        source_dsn=settings.source_dsn(),
        redis_url=settings.redis_url.get_secret_value() if settings.redis_url else None,
        projections=projections or settings.projections, refresh_s=refresh, token=token,
        allow_hosts=tuple(allow_host or ()))
    _check_port_free(host, port)
    shown = "localhost" if host in ("127.0.0.1", "::1") else host
    _err.print(f"lakefold console on http://{escape(shown)}:{port}/"
               + (" (token required)" if token else "")
               + f", reading the store at {escape(dsn_address(store_dsn))}; Ctrl-C stops",
               highlight=False, soft_wrap=True)
    serve(config, host=host, port=port)
