"""Running it all: the runner (a Spark streaming query per projection generation, and every
view's generation in this process), micro-batches, rebuild requests, targeted rebuilds, retries
of dead letters, run reports and ``lakefold status``.

The top room: may import every other room; only the package face
(``lakefold.projections``, ``lakefold.projections.operations``) and the application import it.
"""
