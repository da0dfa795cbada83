"""Views as a user defines them, and the checks made before anything runs.

A view is a query over named inputs, with an output key and a target; lakefold keeps it equal
to the same query over the inputs' current rows (see ``_view_plan`` and ``operators._recompute``)::

    view("revenue_by_city", inputs={"lines": "order_lines"}, key=["city"],
         target=delta_table("upsert", keys=["city"]),
         query="SELECT city, count(*) AS orders, sum(amount) AS revenue "
               "FROM lines GROUP BY city")

    @view("order_lines", key=["order_id"], target=delta_table("upsert", keys=["order_id"]),
          inputs={"orders": changelog("shop.orders"), "customers": changelog("shop.customers")})
    def order_lines(orders, customers):
        return orders.join(customers, orders.customer_id == customers.id).select(...)

An input is a captured table (``changelog(...)``), events of the event store (``events(...)``:
a category, optionally some types; rows keyed by ``position``, see ``_view_events``) or another
view (its name, or the ``View``). With ``registry=`` (an ``EventRegistry``), event inputs have
their payload's fields as columns, typed and upcast; without it, ``data`` as JSON text.
``enrich={"orders": lookup("shop.customers", on="customer_id")}`` adds a captured table's
row to each event of an event input, as of the event's commit (``_lookups``);
``join=interval_join(left=..., right=...)`` joins two event inputs within a time bound stated
in the query, with bounded state (``operators._interval_join``).
Checks, each raising a ``ProjectionDefinitionError`` that says what to fix:

- when defined: the names, the inputs' kinds, a key, a target keyed by that key that does not
  keep history (``_view_targets.check_view_target``);
- over the whole registry (``check_views``): every view an input names exists, and views do
  not read each other in a cycle; ``view_order`` gives the order in which to run them;
- against the stores and Spark (``_view_plan.plan_views``): tables that exist, columns the
  query reads, and a query lakefold can maintain.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from lakefold.projections.definitions._model import ProjectionOptions, check_name, fingerprint
from lakefold.projections.definitions._targets import Target
from lakefold.projections.definitions._view_inputs import EventInput, IntervalJoin, Lookup
from lakefold.projections.definitions._windows import WINDOW_START, Window
from lakefold.projections.exceptions import (
    IncompatibleTargetError,
    MissingKeyError,
    ProjectionDefinitionError,
    UnknownSourceError,
)
from lakefold.schemas import EventRegistry
from lakefold.spark.internals import ChangelogSource, DeltaSource, EventSource

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class ViewInput:
    """One input of a view: a captured table's stream, events, or another view (by name)."""

    table: str | None = None
    view: str | None = None
    events: EventInput | None = None

    @property
    def label(self) -> str:
        if self.events is not None:
            return self.events.label
        return f"changelog {self.table}" if self.table is not None else f"view {self.view}"

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"table": self.table, "view": self.view}
        if self.events is not None:
            out["events"] = {"category": self.events.category, "types": list(self.events.types)}
            if self.events.lookups:
                out["events"]["lookups"] = [lk.describe() for lk in self.events.lookups]
        return out


@dataclass
class View:
    """A registered view (see the module docstring)."""

    name: str
    inputs: Mapping[str, ViewInput]
    query: Query
    key: tuple[str, ...]
    target: Target
    options: ProjectionOptions
    #: Types the payload columns of event inputs (None: ``data`` as JSON text).
    registry: EventRegistry | None = None
    #: A window over event time on one input (``_windows``).
    window: Window | None = None
    #: A join of two event inputs within a time bound (``operators._interval_join``).
    join: IntervalJoin | None = None

    @property
    def upstream(self) -> list[str]:
        """The views this view reads."""
        return [i.view for i in self.inputs.values() if i.view is not None]

    def describe(self) -> dict[str, Any]:
        """A JSON-able description (the catalog fingerprints it)."""
        return {
            "name": self.name, "style": "view",
            "inputs": {k: v.describe() for k, v in self.inputs.items()},
            "query": self.query if isinstance(self.query, str) else
            f"{getattr(self.query, '__module__', '?')}.{getattr(self.query, '__qualname__', '?')}",
            "key": list(self.key),
            "target": vars(self.target) | {"kind": self.target.kind},
        } | ({} if self.registry is None else {"registry": self._payloads()}) \
            | ({} if self.window is None else {"window": self.window.describe()}) \
            | ({} if self.join is None else {"interval_join": self.join.describe()})

    def _payloads(self) -> dict[str, Any]:
        """The registry's types and versions of the event inputs (a new version of one, or
        a new upcaster's type, is a new definition)."""
        assert self.registry is not None  # noqa: S101 - only asked with one
        wanted = {t for i in self.inputs.values() if i.events is not None
                  for t in (i.events.types or self.registry.names)}
        return {t: self.registry.get(t).version for t in sorted(wanted) if t in self.registry}

    def fingerprint(self) -> str:
        return fingerprint(self.describe())


def _inputs(name: str, inputs: object) -> dict[str, ViewInput]:
    if not isinstance(inputs, Mapping) or not inputs:
        raise ProjectionDefinitionError(
            f"view {name}: inputs={{...}} maps the names the query uses to changelog(...) "
            "tables or other views' names; give at least one")
    checked = {}
    for alias, value in inputs.items():
        check_name(f"view {name}'s input", alias)
        if isinstance(value, ChangelogSource):
            checked[alias] = ViewInput(table=value.table)
        elif isinstance(value, EventSource):
            checked[alias] = ViewInput(events=EventInput(value.category, value.types))
        elif isinstance(value, View):
            checked[alias] = ViewInput(view=value.name)
        elif isinstance(value, str):
            checked[alias] = ViewInput(view=check_name("view", value))
        elif isinstance(value, DeltaSource):
            raise ProjectionDefinitionError(
                f"view {name}: input {alias} is {value.label}; views do not read Delta "
                "inputs yet: project it with a projection or Fold (sources=[delta_changes(...)]"
                ", e.g. into delta_table('upsert', keys=[...])), and query that")
        else:
            raise ProjectionDefinitionError(
                f"view {name}: input {alias}={value!r} is not a changelog(...) table, "
                "events(...), a view's name or a view")
    return checked


def _key(name: str, key: object) -> tuple[str, ...]:
    if isinstance(key, str):
        key = [key]
    if not isinstance(key, Sequence) or not key or not all(isinstance(k, str) and k
                                                            for k in key):
        raise MissingKeyError(
            f"view {name}: key=[...] names the output columns that identify a row")
    return tuple(key)


Input = ChangelogSource | EventSource | str | View
#: ``enrich=``: event input name → its lookups (one or several).
Enrichments = Mapping[str, Lookup | Sequence[Lookup]]


def _enrich(name: str, inputs: dict[str, ViewInput], enrich: object) -> dict[str, ViewInput]:
    """The inputs with the lookups of ``enrich`` on their event inputs."""
    if enrich is None:
        return inputs
    if not isinstance(enrich, Mapping):
        raise ProjectionDefinitionError(
            f"view {name}: enrich= maps event inputs' names to lookup(...)s, e.g. "
            "enrich={'orders': lookup('shop.customers', on='customer_id')}")
    out = dict(inputs)
    for alias, given in enrich.items():
        source = inputs.get(alias)
        if source is None or source.events is None:
            what = "is not an input" if source is None else f"is a {source.label}"
            raise ProjectionDefinitionError(
                f"view {name}: enrich names {alias!r}, which {what}; lookups enrich event "
                "inputs (events(...)); join a table's changes in the query instead")
        found = (given,) if isinstance(given, Lookup) else tuple(given) \
            if isinstance(given, Sequence) and not isinstance(given, str) else None
        if not found or not all(isinstance(lk, Lookup) for lk in found):
            raise ProjectionDefinitionError(
                f"view {name}: enrich[{alias!r}]={given!r} is not a lookup(...) or a list of "
                "them")
        out[alias] = replace(source, events=replace(source.events, lookups=found))
    return out


def define_view(name: str, *, inputs: Mapping[str, Input],
                query: Query, key: str | Sequence[str], target: Target,
                options: ProjectionOptions | None = None,
                registry: EventRegistry | None = None, window: Window | None = None,
                enrich: Enrichments | None = None, join: IntervalJoin | None = None) -> View:
    """A view, checked as far as it can be without the stores and Spark."""
    check_name("view", name)
    checked_inputs = _enrich(name, _inputs(name, inputs), enrich)
    checked_key = _key(name, key)
    if not isinstance(target, Target):
        raise IncompatibleTargetError(
            f"view {name}: target {target!r} is not a delta_table(...), redis_cache(...) or "
            "search_index(...)")
    check_view_target(name, checked_key, target)
    if not (isinstance(query, str) and query.strip()) and not callable(query):
        raise ProjectionDefinitionError(
            f"view {name}: query= is Spark SQL text over the inputs' names, or a function "
            "taking the inputs' DataFrames by name")
    if name in {i.view for i in checked_inputs.values()}:
        raise ProjectionDefinitionError(f"view {name} reads itself")
    if registry is not None and not isinstance(registry, EventRegistry):
        raise ProjectionDefinitionError(
            f"view {name}: registry={registry!r} is not an EventRegistry")
    for alias, source in checked_inputs.items():
        unknown = [] if registry is None or source.events is None else \
            [t for t in source.events.types if t not in registry]
        if unknown:
            raise ProjectionDefinitionError(
                f"view {name}: input {alias} reads event type(s) {', '.join(unknown)}, which "
                f"the registry does not know; register them (registry.event(...)) or drop "
                "them from events(types=...)")
    _check_join(name, checked_inputs, window, join)
    _check_window(name, checked_inputs, checked_key, window)
    return View(name, checked_inputs, query, checked_key, target,
                options or ProjectionOptions(), registry, window, join)


def _check_join(name: str, inputs: Mapping[str, ViewInput], window: Window | None,
                join: object) -> None:
    if join is None:
        return
    if not isinstance(join, IntervalJoin):
        raise ProjectionDefinitionError(
            f"view {name}: join={join!r} is not an interval_join(left=..., right=...)")
    if window is not None:
        raise ProjectionDefinitionError(
            f"view {name}: a view has a window or an interval join, not both; join in one "
            "view and window the joined rows in a view over it")
    for side in (join.left, join.right):
        source = inputs.get(side)
        if source is None:
            raise ProjectionDefinitionError(
                f"view {name}: the interval join names input {side!r}, which the view does "
                f"not have; its inputs are {', '.join(inputs)}")
        if source.events is None:
            raise ProjectionDefinitionError(
                f"view {name}: the interval join is over input {side}, a {source.label}; "
                "interval joins are over event inputs (events(...)); join a table's rows "
                "with an equal-key join, or as of each event's commit with lookup(...)")
        if source.events.lookups:
            raise ProjectionDefinitionError(
                f"view {name}: input {side} of the interval join has lookups (enrich=); "
                "enrich the events in a view over the join instead")
    others = [alias for alias in inputs if alias not in (join.left, join.right)]
    if others:
        raise ProjectionDefinitionError(
            f"view {name}: an interval join view reads its two event inputs only, not "
            f"{', '.join(others)}; join those in a view over it")


def _check_window(name: str, inputs: Mapping[str, ViewInput], key: tuple[str, ...],
                  window: object) -> None:
    if window is None:
        return
    if not isinstance(window, Window):
        raise ProjectionDefinitionError(
            f"view {name}: window={window!r} is not a window; use tumbling(...), hopping(...) or "
            "session(...)")
    source = inputs.get(window.input)
    if source is None:
        raise ProjectionDefinitionError(
            f"view {name}: the window is over {window.input}.{window.time}, but the view has "
            f"no input {window.input!r}; its inputs are {', '.join(inputs)}")
    if source.view is not None or (source.table is not None and window.kind == "session"):
        raise ProjectionDefinitionError(
            f"view {name}: the window is over {window.input}.{window.time}, and "
            f"{window.input} is a {source.label}; "
            + ("session windows are over event inputs (events(...)) so far; tumbling and "
               "hopping windows also over a captured table (changelog(...))"
               if source.table is not None else
               "windows are over event inputs (events(...)) and captured tables "
               "(changelog(...)); window the upstream view's inputs instead"))
    if WINDOW_START not in key:
        raise MissingKeyError(
            f"view {name}: a windowed view's key holds {WINDOW_START} (a window's rows are "
            f"one per window and group); the key is {list(key)}")


def view_decorator(name: str, *, inputs: Mapping[str, Input],
                   key: str | Sequence[str], target: Target,
                   options: ProjectionOptions | None = None,
                   registry: EventRegistry | None = None, window: Window | None = None,
                   enrich: Enrichments | None = None, join: IntervalJoin | None = None
                   ) -> Callable[[Callable[..., Any]], View]:
    """``@view(...)`` over a DataFrame function (see the module docstring)."""
    def define(function: Callable[..., Any]) -> View:
        return define_view(name, inputs=inputs, query=function, key=key, target=target,
                           options=options, registry=registry, window=window, enrich=enrich,
                           join=join)

    return define


def check_views(views: Mapping[str, View], others: Sequence[str] = ()) -> list[str]:
    """Check the views of a registry together (``others``: its other projections' names)
    and return them in the order they must run: every view after the views it reads."""
    for view in views.values():
        if view.name in others:
            raise ProjectionDefinitionError(
                f"{view.name} is defined twice (a view and a projection); names are unique")
        for alias, source in view.inputs.items():
            if source.view is not None and source.view not in views:
                known = ", ".join(sorted(views)) or "none"
                raise UnknownSourceError(
                    f"view {view.name}: input {alias} reads view {source.view!r}, which is not "
                    f"defined; the views are: {known}")
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            cycle = [*path[path.index(name):], name]
            raise ProjectionDefinitionError(
                f"views read each other in a cycle: {' → '.join(cycle)}; a view cannot "
                "depend on itself, even through others")
        state[name] = "visiting"
        for upstream in views[name].upstream:
            visit(upstream, [*path, name])
        state[name] = "done"
        order.append(name)

    for name in sorted(views):
        visit(name, [])
    return order


def downstream_of(views: Mapping[str, View], name: str) -> list[str]:
    """The views that read ``name``, directly or through others, in run order."""
    order = check_views(views)
    reached = {name}
    for candidate in order:
        if any(u in reached for u in views[candidate].upstream):
            reached.add(candidate)
    return [n for n in order if n in reached and n != name]


#: A view's query: Spark SQL text over the inputs' names, or a function of the inputs'
#: DataFrames (by name) returning a DataFrame.
Query = str | Callable[..., "DataFrame"]


def check_view_target(view: str, key: tuple[str, ...], target: Target) -> None:
    """Refuse a target that is not keyed by the view's key (a view's rows change in place)."""
    if target.keeps_history:
        raise IncompatibleTargetError(
            f"view {view}: {target.describe()} keeps every version, but a view's rows are "
            "replaced and deleted; use delta_table('upsert', keys=[...]), redis_cache or "
            "search_index")
    if tuple(target.keys) != tuple(key):
        raise IncompatibleTargetError(
            f"view {view}: {target.describe()} is keyed by {list(target.keys)}, the view by "
            f"{list(key)}; key the target by the view's key")
