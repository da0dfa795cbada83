"""lakefold's side of the bench: a query's chain of views, registered and run by a ``Runner``
over the events already in the store until caught up, each into a Delta upsert table.

``events_per_s``: the events in the store / the seconds from the runner's creation until it is
caught up (every view's batches committed, every Delta target written: the same end a user's
``lakefold run --until-caught-up`` has). ``output_events_per_s``: the same run to the views'
committed output streams alone, i.e. without the seconds spent writing the Delta targets (a
view's step commits its batch, then writes its target: the two never overlap).
``state_bytes``: how much the store's database grew (``store_size.database_bytes``)
while the query ran (the views' input states, event feeds, output streams and window
aggregates: what lakefold keeps to maintain the query; nothing is deleted while events are
only appended, so it is also the peak).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from lakefold._bench.nexmark.loading import registry as event_types
from lakefold._bench.nexmark.queries import (
    AUCTION_TYPE,
    BID_TYPE,
    CATEGORY,
    LATENESS_S,
    PERSON_TYPE,
    LakefoldView,
)
from lakefold._bench.store_size import database_bytes

_TYPES = {"person": PERSON_TYPE, "auction": AUCTION_TYPE, "bid": BID_TYPE}


@dataclass
class LakefoldRun:
    """What one query's run gave: its figures, or the error that refused or failed it."""

    events_per_s: float | None = None
    output_events_per_s: float | None = None
    seconds: float | None = None
    target_seconds: float | None = None
    state_bytes: int | None = None
    batches: int | None = None
    result: pa.Table | None = None  # None: no row
    error: str | None = None


def _window(spec: tuple[Any, ...] | None) -> Any:
    from lakefold.projections import hopping, session, tumbling

    if spec is None:
        return None
    lateness = f"{LATENESS_S} seconds"
    if spec[0] == "tumbling":
        return tumbling(spec[1], f"{spec[2]} seconds", lateness=lateness)
    if spec[0] == "hopping":
        return hopping(spec[1], f"{spec[2]} seconds", f"{spec[3]} seconds", lateness=lateness)
    return session(spec[1], f"{spec[2]} seconds", by=spec[3], lateness=lateness)


def register(views: tuple[LakefoldView, ...]) -> Any:
    """A ``Registry`` holding the chain's views (raises the definition's refusal)."""
    from lakefold.projections import Registry, delta_table, events, view
    from lakefold.projections.operations import registering_into

    registered = Registry()
    with registering_into(registered):
        for spec in views:
            inputs: dict[str, Any] = {
                alias: events(CATEGORY, types=[_TYPES[source]]) if source in _TYPES
                else source for alias, source in spec.inputs.items()}
            view(spec.name, inputs=inputs, key=list(spec.key), query=spec.query,
                 target=delta_table("upsert", keys=list(spec.key)), registry=event_types,
                 window=_window(spec.window))
    return registered


def run_views(spark: Any, dsn: str, scratch: Path, views: tuple[LakefoldView, ...],
              events: int) -> LakefoldRun:
    """Run a chain of ``views`` over the ``events`` in the store at ``dsn`` (see the module
    docstring); the result is the last view's. A refusal or a failure is returned as
    ``error`` (its first line), not raised."""
    from deltalake import DeltaTable

    from lakefold.core.exceptions import LakefoldError
    from lakefold.projections import Runner, RunnerConfig
    from lakefold.projections.operations import Catalog, SinkRoots

    outcome = LakefoldRun()
    before = database_bytes(dsn)
    config = RunnerConfig(store_dsn=dsn, roots=SinkRoots.under(scratch / views[-1].name),
                          poll_seconds=0.05)
    try:
        registered = register(views)
        began = time.perf_counter()
        with Runner(spark, registered, config) as runner:
            reports = runner.run(until_caught_up=True, timeout=6 * 3600)
        elapsed = time.perf_counter() - began
        view_runner = runner.views
        writing = 0.0 if view_runner is None else sum(
            run.progress.target_seconds for runs in view_runner.history.values()
            for run in runs)
    except LakefoldError as e:
        outcome.error = str(e).splitlines()[0]
        return outcome
    failed = [r for r in reports if r.state == "failed" or r.error]
    if failed:
        outcome.error = f"view {failed[0].name} failed: {failed[0].error}"
        return outcome
    outcome.seconds = round(elapsed, 3)
    outcome.events_per_s = round(events / elapsed)
    outcome.target_seconds = round(writing, 3)
    outcome.output_events_per_s = round(events / max(elapsed - writing, 1e-3))
    outcome.batches = sum(r.batches for r in reports)
    outcome.state_bytes = database_bytes(dsn) - before
    with Catalog(dsn) as catalog:
        path = catalog.current(views[-1].name).location("delta")
    # a view whose output is still empty has not created its table
    outcome.result = DeltaTable(path).to_pyarrow_table() if DeltaTable.is_deltatable(path) \
        else None
    return outcome
