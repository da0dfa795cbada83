"""Which views a small batch can compute in the process, without a Spark job.

A Spark job costs a few hundred milliseconds however few rows it reads; a batch that changes a
handful of rows needs none of Spark's scale. A view whose analyzed plan has only these steps:

- its inputs (``View``, under ``SubqueryAlias``);
- ``Project`` of columns, each an input's column or one renamed with ``AS``;
- ``Join`` (inner, left, right or full outer) on a conjunction of equalities, each of two
  columns of one type, one from each side, of a type whose equality Spark and Arrow agree on
  (integral, decimal, string, binary, boolean, date, timestamp; not float or double, whose
  NaN and -0.0 Spark normalizes in join keys);

with columns of atomic types only, compiles to a ``LocalPlan`` (scans, column selections and
hash joins) that ``operators._local_query`` runs with Arrow over the very rows Spark would
read, giving the rows Spark gives: bag semantics, NULL keys match nothing, an outer join's
missing side NULL. Anything else is None here, and runs on Spark; so does any batch above
``LOCAL_ROWS`` (Spark stays the engine for what is large).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from lakefold.projections.plan._plan_trees import Node, conjuncts, expr_id, expression_trees

#: The most input rows a batch computes in the process; above it, Spark does.
LOCAL_ROWS: Final = 50_000

_JOIN_KINDS: Final = {"Inner": "inner", "LeftOuter": "left outer", "RightOuter": "right outer",
                      "FullOuter": "full outer"}
_KEY_TYPES: Final = frozenset({"tinyint", "smallint", "int", "bigint", "byte", "short",
                               "integer", "long", "string", "binary", "boolean", "date",
                               "timestamp", "timestamp_ntz"})
_ATOMIC_TYPES: Final = _KEY_TYPES | {"float", "double"}
_DECIMAL: Final = re.compile(r"decimal\(\d+,\d+\)")


@dataclass(frozen=True)
class Scan:
    """An input's rows: (column id, the input's column name) per column, and the Spark type
    of each column, in the input's order (the plan holds while the input has exactly these
    columns: after a DDL, Spark analyzes the query again)."""

    input: str
    columns: tuple[tuple[str, str], ...]
    kinds: tuple[str, ...]


@dataclass(frozen=True)
class Select:
    """Columns of ``child``: (column id out, column id in) per column."""

    child: LocalNode
    columns: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class HashJoin:
    """``left`` joined with ``right`` where every pair of ``keys`` (left id, right id) is
    equal; ``kind`` is Arrow's join type."""

    left: LocalNode
    right: LocalNode
    kind: str
    keys: tuple[tuple[str, str], ...]


LocalNode = Scan | Select | HashJoin


@dataclass(frozen=True)
class LocalPlan:
    """A view's query as Arrow runs it: ``root``'s rows, and (output column name, column id)
    per output column."""

    root: LocalNode
    output: tuple[tuple[str, str], ...]

    def scans(self) -> list[Scan]:
        found: list[Scan] = []
        nodes: list[LocalNode] = [self.root]
        while nodes:
            node = nodes.pop()
            if isinstance(node, Scan):
                found.append(node)
            elif isinstance(node, Select):
                nodes.append(node.child)
            else:
                nodes += [node.left, node.right]
        return found


@dataclass(frozen=True)
class _Column:
    id: str
    name: str
    #: Spark's type as its JSON says it (a text for an atomic type, a mapping otherwise).
    kind: object


def local_plan(tree: Node) -> LocalPlan | None:
    """The plan of a view a small batch computes in the process, from its analyzed plan's
    tree; None when the view needs Spark (see the module docstring)."""
    compiled = _compile(tree)
    if compiled is None:
        return None
    root, columns = compiled
    return LocalPlan(root, tuple((c.name, c.id) for c in columns))


def _atomic(kind: object) -> bool:
    return isinstance(kind, str) and (kind in _ATOMIC_TYPES or bool(_DECIMAL.fullmatch(kind)))


def _key_type(kind: object) -> bool:
    return isinstance(kind, str) and (kind in _KEY_TYPES or bool(_DECIMAL.fullmatch(kind)))


def _column(attribute: Node, name: str | None = None, id_of: Node | None = None) -> _Column:
    return _Column(f"#{expr_id(id_of or attribute)}", name or str(attribute.fields["name"]),
                   attribute.fields.get("dataType"))


def _compile(node: Node) -> tuple[LocalNode, list[_Column]] | None:
    if node.cls == "SubqueryAlias":
        return _compile(node.children[0])
    if node.cls == "View":
        return _scan(node)
    if node.cls == "Project":
        below = _compile(node.children[0])
        return None if below is None else _project(node, *below)
    if node.cls == "Join":
        left, right = _compile(node.children[0]), _compile(node.children[1])
        return None if left is None or right is None else _join(node, left, right)
    return None


def _scan(node: Node) -> tuple[LocalNode, list[_Column]] | None:
    leaf = node
    while leaf.children:
        leaf = leaf.children[0]
    if leaf.cls not in ("LogicalRDD", "LocalRelation"):
        return None
    columns = [_column(e) for e in expression_trees(leaf.fields.get("output"))]
    if not columns or not all(_atomic(c.kind) for c in columns):
        return None
    name = str(node.fields["desc"]["identifier"]["table"])
    return Scan(name, tuple((c.id, c.name) for c in columns),
                tuple(str(c.kind) for c in columns)), columns


def _project(node: Node, child: LocalNode, below: list[_Column]
             ) -> tuple[LocalNode, list[_Column]] | None:
    known = {c.id: c for c in below}
    columns: list[_Column] = []
    pairs: list[tuple[str, str]] = []
    for expression in expression_trees(node.fields.get("projectList")):
        if expression.cls == "Alias" and len(expression.children) == 1 \
                and expression.children[0].cls == "AttributeReference":
            source = _column(expression.children[0])
            column = _Column(f"#{expr_id(expression)}", str(expression.fields["name"]),
                             source.kind)
        elif expression.cls == "AttributeReference":
            source = column = _column(expression)
        else:
            return None
        if source.id not in known:
            return None  # an outer reference, a metadata column: Spark's
        columns.append(column)
        pairs.append((column.id, source.id))
    return Select(child, tuple(pairs)), columns


def _join(node: Node, left: tuple[LocalNode, list[_Column]],
          right: tuple[LocalNode, list[_Column]]) -> tuple[LocalNode, list[_Column]] | None:
    kind = _join_kind(node.fields.get("joinType"))
    conditions = expression_trees(node.fields.get("condition"))
    if kind is None or len(conditions) != 1:
        return None
    left_ids = {c.id: c for c in left[1]}
    right_ids = {c.id: c for c in right[1]}
    keys: list[tuple[str, str]] = []
    for equal in conjuncts(conditions[0]):
        if equal.cls != "EqualTo" or len(equal.children) != 2 or \
                any(c.cls != "AttributeReference" for c in equal.children):
            return None
        a, b = (_column(c) for c in equal.children)
        if a.kind != b.kind or not _key_type(a.kind):
            return None
        if a.id in left_ids and b.id in right_ids:
            keys.append((a.id, b.id))
        elif b.id in left_ids and a.id in right_ids:
            keys.append((b.id, a.id))
        else:
            return None
    return HashJoin(left[0], right[0], kind, tuple(keys)), [*left[1], *right[1]]


def _join_kind(value: object) -> str | None:
    """Arrow's join type for Spark's ``joinType`` field (None: a kind Arrow does not run)."""
    name = value.get("object", "") if isinstance(value, dict) else str(value or "")
    return _JOIN_KINDS.get(name.rsplit(".", 1)[-1].rstrip("$"))
