"""Spark's analyzed logical plans as trees: the JSON form of a plan (``toJSON``), one pre-order
list per tree, read into nodes that the view analyses walk (``_view_plan``, ``_view_aggregates``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Node:
    """One plan node or expression: its class's short name, its JSON fields, its children."""

    cls: str
    fields: dict[str, Any]
    children: list[Node] = field(default_factory=list)


def plan_tree(items: list[dict[str, Any]]) -> Node:
    """A tree from Spark's pre-order JSON (each item says how many children follow)."""
    nodes = iter(items)

    def take() -> Node:
        item = next(nodes)
        node = Node(item["class"].rsplit(".", 1)[-1], item)
        node.children = [take() for _ in range(int(item.get("num-children", 0)))]
        return node

    return take()


def walk(node: Node) -> Iterator[Node]:
    yield node
    for child in node.children:
        yield from walk(child)


def expr_id(node: Node) -> int:
    return int(node.fields["exprId"]["id"])


def expression_trees(value: Any) -> list[Node]:
    """The expression trees of a plan field (one pre-order list, or a list of them)."""
    if not value:
        return []
    if isinstance(value, list) and value and isinstance(value[0], list):
        return [plan_tree(v) for v in value]
    if isinstance(value, list) and value and isinstance(value[0], dict) and "class" in value[0]:
        return [plan_tree(value)]
    return []


def conjuncts(expression: Node) -> list[Node]:
    if expression.cls == "And":
        return [c for child in expression.children for c in conjuncts(child)]
    return [expression]
