"""Which aggregates a one-``GROUP BY`` view can keep by their changes, read off its plan
(``aggregate_plan``); ``operators._view_aggregates`` keeps them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from lakefold.projections.plan._plan_trees import expression_trees, walk

_INTEGRAL = {"tinyint", "smallint", "int", "bigint", "byte", "short", "integer", "long"}


_DECIMAL = re.compile(r"decimal\((\d+),(\d+)\)")


@dataclass(frozen=True)
class Measure:
    """One aggregate output column: ``function`` (``rows``, ``count``, ``sum``, ``avg``,
    ``min``, ``max``, ``distinct``) of input column ``column`` (None for ``rows``), whose
    Spark type is ``kind``."""

    name: str
    function: str
    column: str | None = None
    kind: str = ""

    @property
    def multiset(self) -> bool:
        return self.function in ("min", "max", "distinct")


@dataclass(frozen=True)
class AggregatePlan:
    """A view kept by its changes (see the module docstring)."""

    input: str
    #: (output column, input column) of each grouping column.
    groups: tuple[tuple[str, str], ...]
    measures: tuple[Measure, ...]

    @property
    def columns(self) -> tuple[str, ...]:
        """The input columns the aggregates read (each once)."""
        return tuple(dict.fromkeys(m.column for m in self.measures if m.column is not None))

    @property
    def multisets(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(str(m.column) for m in self.measures if m.multiset))


def _decimal(kind: str) -> tuple[int, int] | None:
    match = _DECIMAL.fullmatch(kind)
    return (int(match[1]), int(match[2])) if match else None


def _supported(function: str, kind: str) -> bool:
    decimal = _decimal(kind)
    if function in ("rows", "count"):
        return True
    if function == "sum":
        return kind in _INTEGRAL or (decimal is not None and decimal[0] + 10 <= 38)
    if function == "avg":
        return kind in _INTEGRAL or (decimal is not None and decimal[0] + 10 <= 38)
    return kind in _INTEGRAL or decimal is not None or kind == "string"


def aggregate_plan(root: Any) -> AggregatePlan | None:
    """The plan of a view kept by its changes, from its analyzed plan's tree (a
    ``_plan_trees.Node``); None when the view does not qualify (it is recomputed by
    partitions)."""
    if root.cls != "Aggregate":
        return None
    below = root.children[0]
    while below.cls == "SubqueryAlias":
        below = below.children[0]
    if below.cls != "View":
        return None
    name = str(below.fields["desc"]["identifier"]["table"])
    grouping = expression_trees(root.fields["groupingExpressions"])
    if not grouping or any(g.cls != "AttributeReference" for g in grouping):
        return None
    group_ids = {int(g.fields["exprId"]["id"]) for g in grouping}
    groups, measures = [], []
    for expression in expression_trees(root.fields["aggregateExpressions"]):
        inner = expression.children[0] if expression.cls == "Alias" else expression
        out = str(expression.fields.get("name", ""))
        if inner.cls == "AttributeReference" and int(inner.fields["exprId"]["id"]) in group_ids:
            groups.append((out, str(inner.fields["name"])))
            continue
        if inner.cls != "AggregateExpression" or len(inner.children) != 1:
            return None  # an expression over aggregates, or an aggregate with FILTER
        function, distinct = inner.children[0], bool(inner.fields.get("isDistinct"))
        arguments = function.children
        if function.cls == "Count" and len(arguments) == 1 and arguments[0].cls == "Literal" \
                and not distinct:
            measures.append(Measure(out, "rows"))
            continue
        if len(arguments) != 1 or arguments[0].cls != "AttributeReference":
            return None
        column, kind = str(arguments[0].fields["name"]), str(arguments[0].fields["dataType"])
        kinds = {("Count", False): "count", ("Count", True): "distinct", ("Sum", False): "sum",
                 ("Average", False): "avg", ("Min", False): "min", ("Max", False): "max",
                 ("Min", True): "min", ("Max", True): "max"}
        chosen = kinds.get((function.cls, distinct))
        if chosen is None or not _supported(chosen, kind) or (
                chosen == "distinct" and kind not in _INTEGRAL and kind != "string"
                and _decimal(kind) is None):
            return None
        measures.append(Measure(out, chosen, column, kind))
    for node in walk(root):
        if node.cls in ("ScalarSubquery", "Exists", "ListQuery"):
            return None
    return AggregatePlan(name, tuple(groups), tuple(measures)) if measures else None
