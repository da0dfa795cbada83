"""The projection API: ``@projection`` for DataFrame transforms and ``Fold`` for per-key fold
handlers, and the ``Registry`` they register into.

A user module looks like this::

    from lakefold.projections import projection, Fold, changelog, events, delta_table, redis_cache

    @projection("customer_cache", sources=[changelog("customers")],
                target=redis_cache(key="id"))
    def customer_cache(customers):
        return customers.select("id", "name", "email", "city")

    revenue = Fold("revenue", sources=[events("order")], key="customer_id",
                   schema="customer_id string, revenue double, orders long",
                   target=delta_table("upsert", keys=["customer_id"]))

    @revenue.on("OrderPlaced")
    def placed(state, record):
        return {**state, "revenue": state.get("revenue", 0) + record.data["amount"],
                "orders": state.get("orders", 0) + 1}

Definitions are checked when they are registered (names, sources, keys, target modes) and
again against the live stores and Spark schemas by ``validate_projections`` before anything
runs; both raise ``ProjectionDefinitionError`` subclasses that say what to fix.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import importlib.util
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

from lakefold.projections.definitions._model import (
    ProjectionOptions,
    check_name,
    event_type_name,
    fingerprint,
)
from lakefold.projections.definitions._targets import Target
from lakefold.projections.definitions._truncate import check_truncatable
from lakefold.projections.definitions._view_api import (
    Enrichments,
    Input as ViewInputs,
    Query,
    View,
    define_view,
    view_decorator,
)
from lakefold.projections.definitions._view_inputs import IntervalJoin
from lakefold.projections.definitions._windows import Window
from lakefold.projections.exceptions import (
    IncompatibleTargetError,
    MissingKeyError,
    ProjectionDefinitionError,
    ProjectionNotFoundError,
)
from lakefold.schemas import EventRegistry
from lakefold.spark.internals import ChangelogSource, DeltaSource, EventSource, Source

Handler = Callable[[dict[str, Any], Any], dict[str, Any] | None]
#: The key of a fold: a field of every record's data, ``"$stream"`` (the event stream id, or
#: the changelog row's table key), or a map of source alias to field for multi-source folds.
FoldKey = str | Mapping[str, str]
STREAM_KEY = "$stream"


@dataclass
class FoldLogic:
    """Per-key fold: ``key`` (see ``FoldKey``) groups records; each handler maps (state,
    record) to the new state, or None to delete the key."""

    key: FoldKey
    key_column: str
    schema: str
    initial: Callable[[object], dict[str, Any]] | None = None
    handlers: dict[str, tuple[Handler, Any]] = field(default_factory=dict)


@dataclass
class Projection:
    """A named view: sources, a target, and either a DataFrame ``transform`` or a ``fold``."""

    name: str
    sources: tuple[Source, ...]
    target: Target
    options: ProjectionOptions
    transform: Callable[..., Any] | None = None
    fold: FoldLogic | None = None
    module: str | None = None

    @property
    def style(self) -> str:
        return "fold" if self.fold is not None else "transform"

    def source(self, alias: str) -> Source:
        for source in self.sources:
            if source.alias == alias:
                return source
        raise ProjectionNotFoundError(f"projection {self.name} has no source named {alias!r}")

    def describe(self) -> dict[str, Any]:
        """A JSON-able description (what the catalog fingerprints to notice a changed
        definition)."""
        return {
            "name": self.name,
            "style": self.style,
            "sources": [vars(s) | {"kind": s.kind} for s in self.sources],
            "target": vars(self.target) | {"kind": self.target.kind},
            "fold_schema": self.fold.schema if self.fold else None,
            "fold_types": sorted(self.fold.handlers) if self.fold else None,
        }

    def fingerprint(self) -> str:
        return fingerprint(self.describe())


class Registry:
    """The projections and views of one module (or one process); names are unique."""

    def __init__(self) -> None:
        self._projections: dict[str, Projection] = {}
        self._views: dict[str, View] = {}

    @property
    def views(self) -> dict[str, View]:
        """The registered views, by name."""
        return dict(self._views)

    def add_view(self, view: View) -> View:
        """Register ``view`` (checked by ``define_view``); a duplicate name is an error."""
        if view.name in self._views or view.name in self._projections:
            raise ProjectionDefinitionError(
                f"{view.name!r} is defined twice; projection and view names must be unique "
                "within a projections module")
        self._views[view.name] = view
        return view

    def add(self, projection: Projection) -> Projection:
        """Register ``projection`` after its static checks; a duplicate name is an error."""
        if projection.name in self._projections or projection.name in self._views:
            raise ProjectionDefinitionError(
                f"projection {projection.name!r} is defined twice; projection names must be "
                "unique within a projections module"
            )
        check_static(projection)
        self._projections[projection.name] = projection
        return projection

    def get(self, name: str) -> Projection:
        try:
            return self._projections[name]
        except KeyError:
            known = ", ".join(sorted(self._projections)) or "none"
            raise ProjectionNotFoundError(
                f"no projection named {name!r}; registered projections: {known}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._projections)

    def __iter__(self) -> Iterator[Projection]:
        return iter(self._projections[name] for name in self.names())

    def __len__(self) -> int:
        return len(self._projections)

    def __contains__(self, name: object) -> bool:
        return name in self._projections


_default_registry = Registry()
_current: contextvars.ContextVar[Registry | None] = contextvars.ContextVar(
    "lakefold_projection_registry", default=None
)


def current_registry() -> Registry:
    """The registry definitions go to: the one being loaded, else the process-wide default."""
    registry = _current.get()
    return registry if registry is not None else _default_registry


@contextlib.contextmanager
def registering_into(registry: Registry) -> Iterator[Registry]:
    """Send every definition made inside the block to ``registry``."""
    token = _current.set(registry)
    try:
        yield registry
    finally:
        _current.reset(token)


def _check_sources(name: str, sources: object) -> tuple[Source, ...]:
    if isinstance(sources, ChangelogSource | EventSource | DeltaSource):
        sources = [sources]
    if not isinstance(sources, list | tuple) or not sources:
        raise ProjectionDefinitionError(
            f"projection {name}: sources=[...] needs at least one changelog(...), events(...) "
            "or delta_changes(...)"
        )
    for source in sources:
        if not isinstance(source, ChangelogSource | EventSource | DeltaSource):
            raise ProjectionDefinitionError(
                f"projection {name}: source {source!r} is not a changelog(...), events(...) "
                "or delta_changes(...)"
            )
    aliases = [s.alias for s in sources]
    duplicates = sorted({a for a in aliases if aliases.count(a) > 1})
    if duplicates:
        raise ProjectionDefinitionError(
            f"projection {name}: two sources are both named {duplicates[0]!r}; give one "
            "an alias=..."
        )
    return tuple(sources)


def _check_target(name: str, target: object) -> Target:
    if not isinstance(target, Target):
        raise IncompatibleTargetError(
            f"projection {name}: target {target!r} is not a delta_table(...), "
            "redis_cache(...) or search_index(...)"
        )
    return target


def check_static(projection: Projection) -> None:
    """Checks that need no store and no Spark: shape of the definition, fold keys vs target."""
    if (projection.transform is None) == (projection.fold is None):
        raise ProjectionDefinitionError(
            f"projection {projection.name}: give either a DataFrame transform or a fold"
        )
    fold = projection.fold
    if fold is None:
        check_truncatable(projection)
        return
    projection.target.check_fold_key(projection.name, fold.key_column)
    restricted = {t for s in projection.sources if isinstance(s, EventSource) for t in s.types}
    only_events = all(isinstance(s, EventSource) for s in projection.sources)
    unrestricted = any(isinstance(s, EventSource) and not s.types for s in projection.sources)
    if only_events and not unrestricted:
        for event_type in fold.handlers:
            if event_type not in restricted:
                raise ProjectionDefinitionError(
                    f"projection {projection.name}: a handler is registered for "
                    f"{event_type!r}, but the sources only deliver {sorted(restricted)}; add "
                    "the type to events(..., types=[...]) or remove the handler"
                )


def projection(
    name: str,
    *,
    sources: Sequence[Source] | Source,
    target: Target,
    options: ProjectionOptions | None = None,
) -> Callable[[Callable[..., Any]], Projection]:
    """Register a DataFrame-transform projection.

    The decorated function receives one streaming DataFrame per source (positionally when
    there is one source, else by source alias) and returns the DataFrame to write. Over event
    sources, Spark's stateful operators (``groupBy().agg()``, ``dropDuplicates``, windows)
    keep their state in the projection's checkpoint; over a changelog they are refused when
    the projection is validated (Spark has no retractions: see ``_stateful``), use a ``Fold``.
    Output columns ``_deleted`` (boolean: delete the key) and
    ``_position`` (long: the source position the row reflects) are honoured when present.
    """
    check_name("projection", name)
    checked_sources = _check_sources(name, sources)
    checked_target = _check_target(name, target)

    def register(function: Callable[..., Any]) -> Projection:
        if not callable(function):
            raise ProjectionDefinitionError(f"projection {name}: decorate a function")
        return current_registry().add(Projection(
            name=name, sources=checked_sources, target=checked_target,
            options=options or ProjectionOptions(), transform=function,
            module=getattr(function, "__module__", None),
        ))

    return register


@overload
def view(name: str, *, inputs: Mapping[str, ViewInputs],
         key: str | list[str] | tuple[str, ...], target: Target, query: Query,
         options: ProjectionOptions | None = None,
         registry: EventRegistry | None = None, window: Window | None = None,
         enrich: Enrichments | None = None, join: IntervalJoin | None = None) -> View: ...


@overload
def view(name: str, *, inputs: Mapping[str, ViewInputs],
         key: str | list[str] | tuple[str, ...], target: Target, query: None = None,
         options: ProjectionOptions | None = None,
         registry: EventRegistry | None = None, window: Window | None = None,
         enrich: Enrichments | None = None, join: IntervalJoin | None = None
         ) -> Callable[[Callable[..., Any]], View]: ...


def view(name: str, *, inputs: Mapping[str, ViewInputs],
         key: str | list[str] | tuple[str, ...], target: Target, query: Query | None = None,
         options: ProjectionOptions | None = None, registry: EventRegistry | None = None,
         window: Window | None = None, enrich: Enrichments | None = None,
         join: IntervalJoin | None = None) -> View | Callable[[Callable[..., Any]], View]:
    """Register a view: ``query`` is Spark SQL over the inputs' names; without it, ``view``
    decorates a function taking the inputs' DataFrames by name (see ``_view_api``);
    ``window``: a window over event time (``tumbling``/``hopping``, see ``_windows``);
    ``enrich``: event input name → ``lookup(...)``s of tables' rows as of each event's
    commit (see ``_lookups``); ``join``: an ``interval_join`` of two event inputs within
    a time bound (see ``operators._interval_join``)."""
    if query is None:
        define = view_decorator(name, inputs=inputs, key=key, target=target, options=options,
                                registry=registry, window=window, enrich=enrich, join=join)

        def register(function: Callable[..., Any]) -> View:
            return current_registry().add_view(define(function))

        return register
    return current_registry().add_view(define_view(
        name, inputs=inputs, query=query, key=key, target=target, options=options,
        registry=registry, window=window, enrich=enrich, join=join))


class Fold:
    """A per-key fold projection, registered on construction; add handlers with ``on``.

    ``key``: the record-data field to group by; ``"$stream"`` for the event stream id; or a
    dict of source alias to field when the sources name the key differently.
    ``schema``: the output columns as a Spark DDL string; the state dict returned by handlers
    is written with these columns (missing ones are null), plus the key column.
    ``initial``: the state of a new key (default: ``{key_column: key}``).
    """

    def __init__(
        self,
        name: str,
        *,
        sources: Sequence[Source] | Source,
        key: FoldKey,
        schema: str,
        target: Target,
        key_column: str | None = None,
        initial: Callable[[object], dict[str, Any]] | None = None,
        options: ProjectionOptions | None = None,
    ) -> None:
        check_name("projection", name)
        checked_sources = _check_sources(name, sources)
        if isinstance(key, Mapping):
            aliases = {s.alias for s in checked_sources}
            if set(key) != aliases or not all(isinstance(v, str) and v for v in key.values()):
                raise MissingKeyError(
                    f"fold {name}: key={dict(key)!r} must map every source alias "
                    f"({', '.join(sorted(aliases))}) to a field name"
                )
        elif not (isinstance(key, str) and key):
            raise MissingKeyError(
                f"fold {name}: key= must name a record field, be '$stream', or map each source "
                "alias to a field"
            )
        if key_column is None:
            if not isinstance(key, str) or key == STREAM_KEY:
                raise MissingKeyError(
                    f"fold {name}: with key={key!r} pass key_column='<output column>' naming "
                    "the column that holds the key"
                )
            key_column = key
        check_name("key column", key_column)
        if not isinstance(schema, str) or not schema.strip():
            raise ProjectionDefinitionError(
                f"fold {name}: schema= must be a Spark DDL string such as "
                "'customer_id string, revenue double'"
            )
        self.name = name
        self._logic = FoldLogic(key=key, key_column=key_column, schema=schema, initial=initial)
        self.projection = current_registry().add(Projection(
            name=name, sources=checked_sources, target=_check_target(name, target),
            options=options or ProjectionOptions(), fold=self._logic,
            module=getattr(initial, "__module__", None),
        ))

    def on(self, *event_types: object) -> Callable[[Handler], Handler]:
        """Register a handler for one or more event types (names or event classes) or
        changelog operations (``"insert"``, ``"update"``, ``"delete"``, and ``"truncate"``:
        called once per key with state when a source table is truncated, to clear that
        table's part of the state; a fold over several sources, one a changelog, needs one;
        see ``_truncate``)."""
        if not event_types:
            raise ProjectionDefinitionError(f"fold {self.name}: on() needs at least one type")
        resolved = [(event_type_name(t), None if isinstance(t, str) else t) for t in event_types]

        def register(handler: Handler) -> Handler:
            if not callable(handler):
                raise ProjectionDefinitionError(f"fold {self.name}: on() decorates a function")
            for type_name, _ in resolved:
                if type_name in self._logic.handlers:
                    raise ProjectionDefinitionError(
                        f"fold {self.name}: two handlers for {type_name!r}; keep one"
                    )
            before = dict(self._logic.handlers)
            for type_name, event_class in resolved:
                self._logic.handlers[type_name] = (handler, event_class)
            try:
                check_static(self.projection)
            except ProjectionDefinitionError:
                self._logic.handlers.clear()
                self._logic.handlers.update(before)
                raise
            if self.projection.module is None:
                self.projection.module = getattr(handler, "__module__", None)
            return handler

        return register


def load_projections(location: str | Path) -> Registry:
    """Import a projections module (a ``.py`` path or a dotted module name) into a fresh
    registry. Modules loaded from a path are pickled by value, so Spark's Python workers can
    run their functions without the file on their import path."""
    registry = Registry()
    text = str(location)
    with registering_into(registry):
        if text.endswith(".py") or Path(text).exists():
            path = Path(text)
            if not path.is_file():
                raise ProjectionNotFoundError(
                    f"projections file {path} does not exist; pass --projections PATH or set "
                    "LAKEFOLD_PROJECTIONS"
                )
            module_name = f"lakefold_user_projections_{uuid.uuid4().hex[:8]}"
            spec = importlib.util.spec_from_file_location(module_name, path)
            if spec is None or spec.loader is None:
                raise ProjectionNotFoundError(f"cannot import {path} as a Python module")
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
            from pyspark import cloudpickle

            cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
        else:
            try:
                if text in sys.modules:
                    importlib.reload(sys.modules[text])
                else:
                    importlib.import_module(text)
            except ModuleNotFoundError as e:
                raise ProjectionNotFoundError(
                    f"projections module {text!r} cannot be imported ({e}); pass a .py path "
                    "or an importable module name"
                ) from e
    if not len(registry) and not registry.views:
        raise ProjectionNotFoundError(f"{text} defines no projections or views")
    return registry
