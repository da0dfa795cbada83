"""``lakefold demo``: the demo of ``lakefold.demo``, against the settings' services (or
throwaway local ones when no DSN is set)."""

from __future__ import annotations

import typer

from lakefold.cli._common import app

__all__ = ["demo"]


@app.command()
def demo(
    rows: int = typer.Option(2_000, help="How many orders the demo workload writes."),
) -> None:
    """Capture a shop database into four views (Delta, Redis, search, SCD2), rebuild one, and
    check them all against SQL.

    Starts throwaway local PostgreSQL and Redis (unless LAKEFOLD_DSN / LAKEFOLD_REDIS_URL are
    set), writes a shop workload (customers, products, orders; inserts, updates, deletes)
    into a fresh lakefold_demo database and captures it into changelog streams. Then runs
    the four views of lakefold/demo/projections.py: revenue_per_customer (a fold, Delta
    upsert), customer_cache (Redis), product_search (Tantivy; a search shows what matched)
    and price_history (SCD2, Delta); shows them, rebuilds customer_cache into a new
    generation and switches to it, and checks every view against the same data computed by
    SQL on the source. It can be run again at once."""
    from lakefold.demo._run import run_demo
    from lakefold.settings import load_settings

    run_demo(load_settings(), orders=rows)
