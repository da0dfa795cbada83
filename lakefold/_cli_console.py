"""``lakefold console``: the operations console (a web page, the JSON API, /metrics)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from lakefold._cli_common import app
from lakefold.core.exceptions import ConfigurationError

_err = Console(stderr=True)


@app.command("console")
def console(
    host: Annotated[str, typer.Option(
        help="Address to listen on. Any but a loopback one needs a token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8470,
    token: Annotated[str | None, typer.Option(
        help="Token every request must carry (default: LAKEFOLD_CONSOLE_TOKEN).",
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
    from lakefold.projections.operations import SinkRoots
    from lakefold.settings import load_settings

    settings = load_settings()
    token = token or (settings.console_token.get_secret_value()
                      if settings.console_token else None)
    check_bind(host, token)  # before anything else: a refused start changes nothing
    store_dsn = settings.resolved_store_dsn()
    if not store_dsn:
        raise ConfigurationError(
            "no store DSN: set LAKEFOLD_STORE_DSN (or LAKEFOLD_DSN) to the PostgreSQL database "
            "that holds lakefold's schema")
    config = ConsoleConfig(
        store_dsn=store_dsn, roots=SinkRoots.under(settings.home, settings.lake_dir),
        source_dsn=settings.source_dsn(),
        redis_url=settings.redis_url.get_secret_value() if settings.redis_url else None,
        projections=projections or settings.projections, refresh_s=refresh, token=token)
    shown = "localhost" if host in ("127.0.0.1", "::1") else host
    _err.print(f"lakefold console on http://{shown}:{port}/"
               + (" (token required)" if token else "") + "; Ctrl-C stops", highlight=False)
    serve(config, host=host, port=port)
