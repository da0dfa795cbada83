"""Stream-stream joins within a time bound: events of one input joined to the events of another
that happened within a bound of them (a search and the clicks of its session within 30
minutes), with state that the bound keeps small.

The view declares which event inputs and time columns are joined, and the allowed lateness::

    view("search_clicks", inputs={"s": events(types=["Searched"]), "c": events(types=["Clicked"])},
         join=interval_join(left="s.occurred_at", right="c.occurred_at", lateness="1 minute"),
         key=["search", "click"], target=...,
         query="SELECT s.position AS search, c.position AS click, ... FROM s LEFT JOIN c "
               "ON c.session_id = s.session_id "
               "AND c.occurred_at BETWEEN s.occurred_at AND s.occurred_at + INTERVAL 30 MINUTES")

**The bound is read off the query** (its join's ON clause): ``lower <= right - left <= upper``,
from comparisons of the two time columns, each side a column plus or minus an interval
constant (``BETWEEN``, ``>=``, ``<=``, ``>``, ``<``). A join without a lower or an upper bound
would have to keep every event forever, and is refused naming the missing bound.

**Watermark and lateness, by the log** (as for windows, ``_windows``): the watermark before an
event is the largest event time of both inputs' events before it in commit order, minus the
allowed lateness. A right event behind the watermark, or a left event whose bound
(``left + upper``) is behind it, may have missed partners already forgotten: it is *late*,
recorded in ``lakefold late list`` with how late, never joined and never dropped silently.

**State is bounded**: once the watermark passes ``left + upper`` no right event that is not
late can join a left event, so it is forgotten from the view's state; a right event is
forgotten once every left event it can join is (``right - lower + upper`` behind the
watermark). Forgetting changes no output row: the key of an interval-join view holds the left
input's ``position``, so a left event's rows are computed on their own, and only while it is
kept.

**Inner joins** write a pair as soon as both events are there. **Left outer joins** write a
left event's rows once its bound passed, when they are final: its pairs, or the left row with
NULLs when nothing joined it (Flink's and Spark's outer interval joins do the same). A late
event cannot be replayed into an interval join (its partners may be gone); a rebuild with a
larger lateness joins it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

from lakefold.projections.definitions._view_inputs import IntervalJoin
from lakefold.projections.exceptions import NotMaintainableError
from lakefold.projections.plan._plan_trees import Node, conjuncts, expr_id, expression_trees, walk

_LOWER_CMP: Final = {"GreaterThanOrEqual", "GreaterThan"}
_UPPER_CMP: Final = {"LessThanOrEqual", "LessThan"}
_ADD: Final = {"TimestampAddInterval", "TimeAdd"}
#: Expressions Spark replaces by their last child (``t - INTERVAL ...``: ``t + -INTERVAL``).
_REPLACED: Final = {"DatetimeSub", "Cast"}


def _interval(node: Node) -> int | None:
    """An interval constant in microseconds (a day-time interval literal, maybe negated)."""
    if node.cls == "UnaryMinus" and node.children:
        inner = _interval(node.children[0])
        return None if inner is None else -inner
    if node.cls == "Cast" and node.children:
        return _interval(node.children[0])
    data_type = str(node.fields.get("dataType", ""))
    if node.cls == "Literal" and data_type.startswith("interval") and \
            data_type != "interval" and node.fields.get("value") is not None:
        return int(node.fields["value"])
    return None


def _offset(node: Node) -> tuple[int, int] | None:
    """(column's expression id, microseconds) when ``node`` is a column plus a constant."""
    if node.cls == "AttributeReference":
        return expr_id(node), 0
    if node.cls in _REPLACED and node.children:
        return _offset(node.children[-1])
    if node.cls in _ADD and len(node.children) == 2:
        base, step = _offset(node.children[0]), _interval(node.children[1])
        if base is not None and step is not None:
            return base[0], base[1] + step
    return None


def _comparisons(condition: Node) -> list[tuple[str, Node, Node]]:
    """``(class, a, b)`` for each comparison ``a <op> b`` among the conjuncts (``BETWEEN``
    as its two)."""
    out = []
    for part in conjuncts(condition):
        if part.cls in _LOWER_CMP | _UPPER_CMP and len(part.children) == 2:
            out.append((part.cls, part.children[0], part.children[1]))
        elif part.cls == "Between":
            value = expression_trees(part.fields.get("input"))
            low = expression_trees(part.fields.get("lower"))
            high = expression_trees(part.fields.get("upper"))
            if value and low and high:
                out.append(("GreaterThanOrEqual", value[0], low[0]))
                out.append(("LessThanOrEqual", value[0], high[0]))
    return out


def bound_join(view: str, join: IntervalJoin, plan: Node) -> IntervalJoin:
    """``join`` with its bound and kind read off the view's analyzed plan (see the module
    docstring); refused when the query does not bound it both ways."""
    columns: dict[int, tuple[str, str]] = {}
    for node in walk(plan):
        if node.cls == "View":
            name = str(node.fields["desc"]["identifier"]["table"])
            leaf = node
            while leaf.children:
                leaf = leaf.children[0]
            for attribute in expression_trees(leaf.fields.get("output")):
                columns[expr_id(attribute)] = (name, str(attribute.fields["name"]))
    left, right = (join.left, join.left_time), (join.right, join.right_time)
    lower: int | None = None
    upper: int | None = None
    kind = None
    for node in walk(plan):
        if node.cls != "Join":
            continue
        for condition in expression_trees(node.fields.get("condition")):
            for cls, a, b in _comparisons(condition):
                oa, ob = _offset(a), _offset(b)
                if oa is None or ob is None:
                    continue
                ca, cb = columns.get(oa[0]), columns.get(ob[0])
                if (ca, cb) == (right, left):  # right + x ? left + y: right - left ? y - x
                    found, is_lower = ob[1] - oa[1], cls in _LOWER_CMP
                elif (ca, cb) == (left, right):  # left + x ? right + y: right - left ?' x - y
                    found, is_lower = oa[1] - ob[1], cls in _UPPER_CMP
                else:
                    continue
                kind = str(node.fields["joinType"].get("object", "")).rsplit(".", 1)[-1] \
                    .rstrip("$")
                if is_lower:
                    lower = found if lower is None else max(lower, found)
                else:
                    upper = found if upper is None else min(upper, found)
    l_name, r_name = f"{join.left}.{join.left_time}", f"{join.right}.{join.right_time}"
    example = (f"{r_name} BETWEEN {l_name} AND {l_name} + INTERVAL 30 MINUTES")
    if lower is None or upper is None:
        missing = "lower bound" if lower is None else "upper bound"
        if lower is None and upper is None:
            missing = "lower or upper bound"
        raise NotMaintainableError(
            f"view {view}: the interval join of {r_name} to {l_name} has no {missing} in the "
            "query's join condition, so it would keep every event forever; bound it in the "
            f"ON clause with a time column plus or minus an interval constant, e.g. {example}")
    if lower > upper:
        raise NotMaintainableError(
            f"view {view}: the interval join's bound is empty ({r_name} - {l_name} between "
            f"{lower / 1e6:g} s and {upper / 1e6:g} s): no pair can join")
    if kind not in ("Inner", "LeftOuter"):
        raise NotMaintainableError(
            f"view {view}: the interval join is a {kind} join; inner and left outer "
            f"({join.left} LEFT JOIN {join.right}) joins are maintained")
    return replace(join, lower_us=lower, upper_us=upper, outer=kind == "LeftOuter")
