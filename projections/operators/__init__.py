"""The operators that execute a plan, a batch at a time: the view maintainer, event feeds (with
lookups and sessions), windows over a table's time column, folded window aggregates, kept
aggregates, and the per-key folds Spark runs for ``Fold`` projections.

May import ``definitions``, ``state``, ``plan`` and the packages below projections; never
``targets`` (a sibling) or ``runtime``.
"""
