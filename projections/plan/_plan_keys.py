"""Which output columns identify a view's rows, read off the query's plan before anything runs.

A view's declared key must identify one output row: its maintenance replaces rows by key, and
two rows with one key would overwrite each other. Each input's rows have a key (a table's
primary key, an event's position, another view's key); the plan tells which column sets stay
unique through it (``unique_keys``):

- a filter, a sort or an alias keeps its input's keys; ``DISTINCT`` adds all its columns;
- a projection keeps a key whose columns it outputs (a full outer join's ``COALESCE`` of both
  join keys stands for either of them);
- a ``GROUP BY`` is keyed by its grouping columns (none: one row);
- a join is keyed by a key of each side together; a side joined on equal keys that cover a
  whole key of the other side (each of its rows meets at most one row there, as an order meets
  its one customer) keeps its own keys too; a semi or anti join keeps its left side's keys;
- a union, and any step not listed, says nothing: the key is checked as rows come.

A declared key also counts the columns it determines (``_Dependencies``): an input's key
determines the input's other columns (``GROUP BY c.id, c.name`` is keyed by ``c.id``),
columns an inner join holds equal determine each other, and a window's ``window_end``
follows from its ``window_start`` (of a session, with the columns it is by).

``check_key`` refuses a declared key that determines none of the keys the plan shows, before
the view runs: a key the plan cannot vouch for would stop the view at its first batch with
two rows of one key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from lakefold.projections.exceptions import MissingKeyError
from lakefold.projections.plan._plan_trees import Node, conjuncts, expr_id, expression_trees, walk

#: Sets of output expression ids, each identifying one row; None: unknown.
Keys = list[frozenset[int]] | None
_SAME_KEYS = {"SubqueryAlias", "Filter", "Sort", "ResolvedHint", "Repartition",
              "RepartitionByExpression"}


@dataclass(frozen=True)
class WindowColumns:
    """A windowed input's window columns: ``window_end`` follows from ``window_start`` and
    (for a session) the columns ``by``."""

    input: str
    by: tuple[str, ...] = ()


def _leaf_output(node: Node) -> dict[str, int]:
    leaf = node
    while leaf.children:
        leaf = leaf.children[0]
    return {str(e.fields["name"]): expr_id(e) for e in expression_trees(leaf.fields.get("output"))}


def _inner(expression: Node) -> Node:
    return expression.children[0] if expression.cls == "Alias" else expression


def _join_kind(node: Node) -> str:
    return str(node.fields["joinType"].get("object", "")).rsplit(".", 1)[-1].rstrip("$")


def _equal_pairs(node: Node) -> list[tuple[int, int]]:
    """The (left id, right id) pairs a join's condition holds equal."""
    left = set(_output_ids(node.children[0]) or ())
    pairs = []
    for condition in expression_trees(node.fields.get("condition")):
        for part in conjuncts(condition):
            sides = [c.children[0] if c.cls == "Cast" and c.children else c
                     for c in part.children]
            if part.cls not in ("EqualTo", "EqualNullSafe") or len(sides) != 2 or any(
                    s.cls != "AttributeReference" for s in sides):
                continue
            a, b = (expr_id(s) for s in sides)
            pairs.append((a, b) if a in left else (b, a))
    return pairs


def _output_ids(node: Node) -> list[int] | None:
    """The expression ids a plan node outputs (where this module can tell)."""
    if node.cls == "View":
        return list(_leaf_output(node).values())
    if node.cls in _SAME_KEYS or node.cls in ("Distinct", "Deduplicate"):
        return _output_ids(node.children[0])
    if node.cls == "Project":
        return [expr_id(e) for e in expression_trees(node.fields["projectList"])]
    if node.cls == "Aggregate":
        return [expr_id(e) for e in expression_trees(node.fields["aggregateExpressions"])]
    if node.cls == "Join":
        left, right = (_output_ids(c) for c in node.children)
        if left is None or right is None:
            return None
        return left if _join_kind(node) in ("LeftSemi", "LeftAnti") else left + right
    return None


@dataclass
class _Dependencies:
    """Which expression ids determine which (see the module docstring)."""

    #: id → the ids it has the very value of (aliases, inner join keys), itself included.
    same: dict[int, set[int]] = field(default_factory=dict)
    #: (determining ids, determined ids)
    rules: list[tuple[frozenset[int], frozenset[int]]] = field(default_factory=list)

    def link(self, a: int, b: int) -> None:
        group = self.same.setdefault(a, {a}) | self.same.setdefault(b, {b})
        for i in group:
            self.same[i] = group

    def closure(self, ids: Iterable[int]) -> set[int]:
        found = set(ids)
        while True:
            before = len(found)
            for i in list(found):
                found |= self.same.get(i, {i})
            for left, right in self.rules:
                if left <= found:
                    found |= right
            if len(found) == before:
                return found


def dependencies(root: Node, input_keys: Mapping[str, Sequence[str]],
                 window: WindowColumns | None) -> _Dependencies:
    """The dependencies between the expression ids of a plan (see the module docstring)."""
    found = _Dependencies()
    for node in walk(root):
        if node.cls == "View":
            name = str(node.fields["desc"]["identifier"]["table"])
            columns = _leaf_output(node)
            keys = input_keys.get(name)
            if keys is not None and all(k in columns for k in keys):
                found.rules.append((frozenset(columns[k] for k in keys),
                                    frozenset(columns.values())))
            if window is not None and window.input == name and \
                    {"window_start", "window_end", *window.by} <= set(columns):
                found.rules.append((frozenset(columns[c] for c in ("window_start", *window.by)),
                                    frozenset({columns["window_end"]})))
        for name in ("projectList", "aggregateExpressions"):
            for expression in expression_trees(node.fields.get(name)):
                inner = _inner(expression)
                if expression.cls == "Alias" and inner.cls == "AttributeReference":
                    found.link(expr_id(expression), expr_id(inner))
        if node.cls == "Join" and _join_kind(node) == "Inner":
            for a, b in _equal_pairs(node):
                found.link(a, b)
    return found


def unique_keys(node: Node, input_keys: Mapping[str, Sequence[str]]) -> Keys:
    """The column sets (output expression ids) that identify one row of ``node``'s output
    (see the module docstring); ``input_keys``: each input's key columns by input name."""
    cls = node.cls
    if cls == "View":
        name = str(node.fields["desc"]["identifier"]["table"])
        columns = _leaf_output(node)
        keys = input_keys.get(name)
        if keys is None or any(k not in columns for k in keys):
            return None
        return [frozenset(columns[k] for k in keys)]
    if cls in _SAME_KEYS:
        return unique_keys(node.children[0], input_keys)
    if cls in ("Distinct", "Deduplicate"):
        below = unique_keys(node.children[0], input_keys) or []
        everything = _output_ids(node.children[0])
        return below + ([frozenset(everything)] if everything is not None else [])
    if cls == "Project":
        return _project(node, unique_keys(node.children[0], input_keys))
    if cls == "Aggregate":
        return _aggregate(node)
    if cls == "Join":
        return _join(node, unique_keys(node.children[0], input_keys),
                     unique_keys(node.children[1], input_keys))
    return None


def _project(node: Node, below: Keys) -> Keys:
    if below is None:
        return None
    carried: dict[int, set[int]] = {}  # input id → the output ids that carry its value
    for expression in expression_trees(node.fields["projectList"]):
        inner = _inner(expression)
        sources = [inner] if inner.cls == "AttributeReference" else \
            list(inner.children) if inner.cls == "Coalesce" else []
        for source in sources:
            if source.cls == "AttributeReference":
                carried.setdefault(expr_id(source), set()).add(expr_id(expression))
    return [frozenset(min(carried[i]) for i in key) for key in below
            if all(i in carried for i in key)]


def _aggregate(node: Node) -> Keys:
    grouping = expression_trees(node.fields["groupingExpressions"])
    if any(g.cls != "AttributeReference" for g in grouping):
        return None
    # the grouping ids themselves: their dependencies say which output columns carry them
    return [frozenset(expr_id(g) for g in grouping)]


def _join(node: Node, left: Keys, right: Keys) -> Keys:
    kind = _join_kind(node)
    if kind in ("LeftSemi", "LeftAnti"):
        return left
    if left is None or right is None:
        return None
    pairs = _equal_pairs(node)
    left_equal, right_equal = {a for a, _ in pairs}, {b for _, b in pairs}
    out = [a | b for a in left for b in right]
    if kind in ("Inner", "LeftOuter") and any(k <= right_equal for k in right):
        out += left  # each left row meets at most one right row
    if kind in ("Inner", "RightOuter") and any(k <= left_equal for k in left):
        out += right
    return out


def check_key(view: str, root: Node, key: Sequence[str], output: Sequence[int],
              names: Sequence[str], input_keys: Mapping[str, Sequence[str]],
              window: WindowColumns | None = None) -> None:
    """Refuse ``key`` when the plan shows keys and ``key`` determines none of them."""
    keys = unique_keys(root, input_keys)
    if keys is None:
        return
    by_name = dict(zip(names, output, strict=True))
    rules = dependencies(root, input_keys, window)
    determined = rules.closure(by_name[k] for k in key)
    if any(k <= determined for k in keys):
        return
    by_id = {i: n for n, i in by_name.items()}
    shown = []
    for k in keys:
        named = sorted({by_id[j] for i in k for j in rules.same.get(i, {i}) if j in by_id})
        if named:
            shown.append(named)
    hint = ("; the rows are identified by " + " or ".join(
        f"[{', '.join(k)}]" for k in sorted(shown, key=len)[:3])) if shown else \
        "; no set of its output columns identifies a row (output an input's key too)"
    raise MissingKeyError(
        f"view {view}: key [{', '.join(key)}] may hold several rows: nothing in the query "
        f"makes it unique{hint}. Declare a key that identifies one row")
