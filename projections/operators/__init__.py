"""The operators that execute a plan, a batch at a time.

A view's plan carries one tag (``ViewPlan.operator``); one class per tag executes it through one
protocol, feed → apply → emit → commit (``_operator``): ``_recompute``, ``_windowed``,
``_kept_aggregate``, ``_window_fold``, ``_interval_join``, over the pieces they share
(``_view_core``), driven by the maintainer (``_view_maintainer``, whose ``OPERATORS`` maps each
tag to its class). Beside them: the feeds (``Feed``: event feeds with lookups and sessions, a
table's time-column windows), folded window aggregates, kept aggregates, and the per-key folds
Spark runs for ``Fold`` projections.

May import ``definitions``, ``state``, ``plan`` and the packages below projections; never
``targets`` (a sibling) or ``runtime``.
"""
