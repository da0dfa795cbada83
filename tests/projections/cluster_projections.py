"""The projections of ``lakefold run`` on a standalone cluster (test_cluster_run.py): those of
s3_projections.py (a fold with Spark-managed state, an append and an SCD2 table over the
``order`` events) and of view_projections.py (order_lines, and revenue_by_city over it, over
the captured shop tables). Importing the two modules registers their definitions with the
registry that loads this one; the executors import them from the repository (the test puts it
on their Python path)."""

from tests.projections import s3_projections, view_projections  # noqa: F401
