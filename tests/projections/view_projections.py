"""Views for the SIGKILL loop (``kill_child``): the shop's order lines and revenue per city,
each into a Delta upsert table (``test_view_crash.py``)."""

from __future__ import annotations

from lakefold.projections import changelog, delta_table, view
from tests.projections.view_shop import ORDER_LINES, REVENUE_BY_CITY

lines = view("order_lines", key=["order_id"], target=delta_table("upsert", keys=["order_id"]),
             inputs={"orders": changelog("public.orders"),
                     "customers": changelog("public.customers"),
                     "products": changelog("public.products")},
             query=ORDER_LINES)
view("revenue_by_city", inputs={"lines": lines}, key=["city"],
     target=delta_table("upsert", keys=["city"]), query=REVENUE_BY_CITY)
