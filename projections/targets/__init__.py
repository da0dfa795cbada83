"""The target kinds (Delta, the Redis cache, the search index) implementing ``definitions``'s target
protocol, their readers, a view's target kept equal to its output stream, and the table catalog
``lakefold query`` reads.

May import ``definitions``, ``state`` and the packages below projections; never ``plan``,
``operators`` (a sibling) or ``runtime``.
"""
