"""Asking for a rebuild: begin generation N+1 of a projection (or of a view and every view
downstream of it) in the catalog, where a running runner picks it up, builds it beside the
live one and switches to it (``_runner``).

Needs the projections' registry (to check the rebuild and to find a view's downstream views)
and the store, not Spark: ``lakefold rebuild`` and the console's rebuild action both ask here.
"""

from __future__ import annotations

from lakefold.projections.definitions._api import Registry
from lakefold.projections.definitions._view_api import downstream_of
from lakefold.projections.state._catalog import Catalog, Generation
from lakefold.projections.state._readers import GenerationReads, check_rebuild


def request_rebuild(catalog: Catalog, store_dsn: str, registry: Registry,
                    name: str) -> Generation:
    """Begin building generation N+1 of NAME; the runner switches to it once it has caught
    up. A view is rebuilt with every view that reads it (they switch together).

    A view that keeps every version (Delta scd2 or append) over a stream that compaction
    trimmed is refused (BehindCompactionError naming the compaction): its rebuild would not
    be the history the live generation built. The new generation holds its changelog
    positions (at 0) from here on."""
    if name in registry.views:
        return _rebuild_views(catalog, registry, name)
    projection = registry.get(name)
    check_rebuild(store_dsn, projection, catalog.current(name).generation + 1)
    generation = catalog.begin_rebuild(name)
    reads = GenerationReads(store_dsn, projection, generation.generation)
    try:
        reads.attach({})
    except BaseException:
        catalog.abandon(name, generation.generation)
        raise
    finally:
        reads.close()
    return generation


def _rebuild_views(catalog: Catalog, registry: Registry, name: str) -> Generation:
    """Begin a new generation of view NAME and of every view downstream of it: they are
    built together and switch together (see ``_view_runner``)."""
    names = [name, *downstream_of(registry.views, name)]
    begun: list[Generation] = []
    try:
        for view in names:
            begun.append(catalog.begin_rebuild(view))
    except BaseException:
        for generation in begun:
            catalog.abandon(generation.name, generation.generation)
        raise
    return begun[0]
