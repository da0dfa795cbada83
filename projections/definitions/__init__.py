"""What a user writes: projections (``@projection``, ``Fold``), views (``view``), their inputs
(``changelog``, ``events``, ``lookup``, ``interval_join``), windows (``tumbling``, ``hopping``,
``session``), targets (``delta_table``, ``redis_cache``, ``search_index``) and the target
protocol every target kind implements, the TRUNCATE policy, and the JSON codec of held values.

The lowest room of ``lakefold.projections``: it may import ``lakefold.projections.exceptions``
and the packages below projections (core, schemas, the stores, spark's source inputs), never
another room. Everything here is a value or a check made before anything runs.
"""
