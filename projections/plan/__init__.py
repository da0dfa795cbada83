"""Planning, before anything runs: a view's query read off Spark's analyzed plan into how it is
maintained (``ViewPlan``: whole or by partition, a kept aggregate, a window fold, an interval
join's bounds), the columns that key its rows, where a batch cuts a chain's inputs, and the
checks of a projection's transform (which columns it reads; no state across records).

May import ``definitions``, ``state`` and the packages below projections; never ``operators``,
``targets`` or ``runtime``. Operators execute what is decided here and do not decide again.
"""
