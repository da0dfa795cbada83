"""What the application (CLI, console, benches, demo) needs to operate projections beyond
defining and running them: the catalog of generations and where their sinks live, status
reports, the runner's Spark settings, asking for a rebuild (``request_rebuild``, no Spark
needed), releasing retired generations' changelog positions, the registry context, the query
catalog of projection tables, and a view's parts (maintainer, target writer) for the views
bench. Loaded lazily, like the package."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakefold.core.lazy import lazy_getattr

if TYPE_CHECKING:
    from lakefold.projections._api import current_registry, registering_into
    from lakefold.projections._catalog import Catalog, Generation, SinkRoots
    from lakefold.projections._late_events import LateEvent, late_events, replay_late_events
    from lakefold.projections._readers import release_gone
    from lakefold.projections._rebuild_request import request_rebuild
    from lakefold.projections._redis import drop_prefix
    from lakefold.projections._runner import RUNNER_SPARK_CONF
    from lakefold.projections._status import projection_status, slot_status
    from lakefold.projections._tables import ProjectionTableCatalog
    from lakefold.projections._targets import TargetContext
    from lakefold.projections._view_maintainer import ViewMaintainer, open_view, output_stream
    from lakefold.projections._view_targets import ViewTargetWriter

_EXPORTS: dict[str, str] = {
    "current_registry": "_api", "registering_into": "_api",
    "Catalog": "_catalog", "Generation": "_catalog", "SinkRoots": "_catalog",
    "LateEvent": "_late_events", "late_events": "_late_events",
    "replay_late_events": "_late_events",
    "release_gone": "_readers", "request_rebuild": "_rebuild_request",
    "drop_prefix": "_redis", "RUNNER_SPARK_CONF": "_runner",
    "projection_status": "_status", "slot_status": "_status",
    "ProjectionTableCatalog": "_tables", "TargetContext": "_targets",
    "ViewMaintainer": "_view_maintainer", "open_view": "_view_maintainer",
    "output_stream": "_view_maintainer", "ViewTargetWriter": "_view_targets",
}

__all__ = [
    "RUNNER_SPARK_CONF",
    "Catalog",
    "Generation",
    "LateEvent",
    "ProjectionTableCatalog",
    "SinkRoots",
    "TargetContext",
    "ViewMaintainer",
    "ViewTargetWriter",
    "current_registry",
    "drop_prefix",
    "late_events",
    "open_view",
    "output_stream",
    "projection_status",
    "registering_into",
    "release_gone",
    "replay_late_events",
    "request_rebuild",
    "slot_status",
]

__getattr__ = lazy_getattr(
    "lakefold.projections.operations",
    {name: f"lakefold.projections.{module}" for name, module in _EXPORTS.items()},
)


def __dir__() -> list[str]:
    return __all__
