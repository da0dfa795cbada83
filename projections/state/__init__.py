"""What the projections keep in the store: the catalog (names, generations, sink state), dead
letters, late events, the event times of deleted events, the windows not yet final, and what a
generation has read.

May import ``definitions`` and the packages below projections; never ``plan``, ``operators``,
``targets`` or ``runtime``.
"""
