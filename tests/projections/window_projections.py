"""Views for the SIGKILL loop (``kill_child``) over page-view events: page views per minute
(late events listed), the per-minute totals over them, and each view enriched with its
customer's city as of its commit; searches joined to clicks within a time bound, and visits
in session windows (``test_view_crash.py``)."""

from __future__ import annotations

from lakefold.projections import delta_table, events, lookup, view
from tests.projections.test_view_interval_joins import define_joins
from tests.projections.test_view_sessions import define_sessions
from tests.projections.window_oracle import define, event_types

define(("per_minute",))
define_joins()
define_sessions()
view("views_with_city", inputs={"views": events("site", types=["page.viewed"])},
     key="position", target=delta_table("upsert", keys=["position"]), registry=event_types(),
     enrich={"views": lookup("public.customers", on="customer", columns=["city"])},
     query="SELECT position, customer, city FROM views")
