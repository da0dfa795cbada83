"""What the application (CLI, console, benches, demo) needs to operate projections beyond
defining and running them: the catalog of generations and where their sinks live, status
reports, the runner's Spark settings, asking for a rebuild (``request_rebuild``, no Spark
needed), releasing retired generations' changelog positions, the registry context, the query
catalog of projection tables, a view's parts (maintainer, target writer) for the views
bench, and the Delta target's writer for the delta-spark bench. Loaded lazily, like the package."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakefold.core.lazy import lazy_getattr

if TYPE_CHECKING:
    from lakefold.projections.definitions._api import current_registry, registering_into
    from lakefold.projections.definitions._targets import TargetContext
    from lakefold.projections.operators._view_core import output_stream
    from lakefold.projections.operators._view_maintainer import ViewMaintainer, open_view
    from lakefold.projections.runtime._rebuild_request import request_rebuild
    from lakefold.projections.runtime._runner import RUNNER_SPARK_CONF
    from lakefold.projections.runtime._status import projection_status, slot_status
    from lakefold.projections.state._catalog import Catalog, Generation, SinkRoots
    from lakefold.projections.state._late_events import LateEvent, late_events, replay_late_events
    from lakefold.projections.state._readers import release_gone
    from lakefold.projections.targets._delta import DeltaViewWriter
    from lakefold.projections.targets._redis import drop_prefix
    from lakefold.projections.targets._tables import ProjectionTableCatalog
    from lakefold.projections.targets._view_targets import ViewTargetWriter

_EXPORTS: dict[str, str] = {
    "current_registry": "definitions._api", "registering_into": "definitions._api",
    "Catalog": "state._catalog", "Generation": "state._catalog", "SinkRoots": "state._catalog",
    "LateEvent": "state._late_events", "late_events": "state._late_events",
    "replay_late_events": "state._late_events",
    "release_gone": "state._readers", "request_rebuild": "runtime._rebuild_request",
    "drop_prefix": "targets._redis", "DeltaViewWriter": "targets._delta",
    "RUNNER_SPARK_CONF": "runtime._runner",
    "projection_status": "runtime._status", "slot_status": "runtime._status",
    "ProjectionTableCatalog": "targets._tables", "TargetContext": "definitions._targets",
    "ViewMaintainer": "operators._view_maintainer", "open_view": "operators._view_maintainer",
    "output_stream": "operators._view_core", "ViewTargetWriter": "targets._view_targets",
}

__all__ = [
    "RUNNER_SPARK_CONF",
    "Catalog",
    "DeltaViewWriter",
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
