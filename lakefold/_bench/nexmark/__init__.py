"""``lakefold bench nexmark``: Nexmark, the streaming benchmark Flink, RisingWave, Feldera and
Arroyo are compared on, run by lakefold's views and, in the same run on the same events, by
Spark Structured Streaming and Flink SQL (PyFlink), every result checked against a DuckDB batch
oracle.

- ``generator``: the events (Nexmark's model, seeded); ``loading``: into lakefold's event store
  (registered pydantic models; not timed) and into Parquet files for the others.
- ``queries``: q0-q22 in every engine's words, and why those not run are not.
- ``lakefold_engine``: each query's chain of views run by a ``Runner`` into Delta, until caught
  up; a query's Nexmark-shaped single view is tried first and its refusal reported.
- ``spark_peer``, ``flink_peer`` (+ ``flink_job``, run in PyFlink's own virtualenv): the peers.
- ``oracle``: DuckDB over the Parquet files, lakefold's window semantics.

JSON: ``results.queries.<q>`` (``events_per_s``, ``correct``, ``state_bytes``, ``form``: view (as
Nexmark writes it), native (the same, tried first and accepted), rewrite or chain (the one-view
form refused, with ``refused``: the refusal's text; the query rewritten as one view or as a
chain of views) or refused), ``results.correct.<q>``, and
``baseline.spark.<q>`` / ``baseline.flink.<q>`` (``events_per_s``, ``correct``, or
``not_run`` with the reason); ``ratio_to_spark`` / ``ratio_to_flink`` per query.
"""

from __future__ import annotations

from lakefold._bench.nexmark import command

__all__ = ["command"]
