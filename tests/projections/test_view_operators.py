"""The plan's tags and the operators that execute them: one class per tag, and only the
maintainer reads the tag (no operator decides again what the planner decided)."""

from __future__ import annotations

import ast
from pathlib import Path

from lakefold.projections.operators._operator import ViewOperator
from lakefold.projections.operators._view_maintainer import OPERATORS
from lakefold.projections.plan._view_plan import Operator

OPERATORS_DIR = Path(__file__).resolve().parents[2] / "projections" / "operators"


def test_every_tag_has_exactly_one_operator_class() -> None:
    assert set(OPERATORS) == set(Operator)
    for tag, kind in OPERATORS.items():
        assert issubclass(kind, ViewOperator) and kind.tag is tag
    assert len(set(OPERATORS.values())) == len(Operator)


def test_only_the_maintainer_reads_the_plans_tag() -> None:
    readers = []
    for module in sorted(OPERATORS_DIR.glob("*.py")):
        tree = ast.parse(module.read_text())
        if any(isinstance(node, ast.Attribute) and node.attr == "operator"
               and isinstance(node.value, ast.Attribute) and node.value.attr == "plan"
               for node in ast.walk(tree)):
            readers.append(module.name)
    assert readers == ["_view_maintainer.py"]

