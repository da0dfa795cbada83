"""Defining views: every refused definition says what is wrong and what to do, before
anything runs; views come out in the order they must run."""

from __future__ import annotations

from typing import Any

import pytest

from lakefold.capture import CaptureConfig
from lakefold.projections.definitions._api import Registry, registering_into, view
from lakefold.projections.definitions._model import changelog
from lakefold.projections.definitions._target_specs import delta_table, redis_cache
from lakefold.projections.definitions._view_api import check_views, downstream_of
from lakefold.projections.exceptions import (
    IncompatibleTargetError,
    MissingKeyError,
    NotMaintainableError,
    ProjectionDefinitionError,
    UnknownSourceError,
)
from lakefold.projections.runtime._view_validation import plan_views
from tests.projections.view_shop import ORDER_LINES, REVENUE_BY_CITY

pytestmark = pytest.mark.timeout(120)
SHOP = {"orders": changelog("public.orders"), "customers": changelog("public.customers"),
        "products": changelog("public.products")}


def _shop_views(registry: Registry) -> None:
    with registering_into(registry):
        view("order_lines", inputs=SHOP, key=["order_id"], query=ORDER_LINES,
             target=delta_table("upsert", keys=["order_id"]))
        view("revenue_by_city", inputs={"lines": "order_lines"}, key="city",
             query=REVENUE_BY_CITY, target=redis_cache("city"))


def test_views_register_and_run_after_the_views_they_read() -> None:
    registry = Registry()
    _shop_views(registry)
    with registering_into(registry):
        @view("big_spenders", inputs={"totals": "revenue_by_city"}, key=["city"],
              target=delta_table("upsert", keys=["city"]))
        def big_spenders(totals: Any) -> Any:
            return totals.where("revenue > 100")
    views = registry.views
    assert check_views(views) == ["order_lines", "revenue_by_city", "big_spenders"]
    assert downstream_of(views, "order_lines") == ["revenue_by_city", "big_spenders"]
    assert views["big_spenders"].upstream == ["revenue_by_city"]
    assert views["order_lines"].fingerprint() != views["big_spenders"].fingerprint()


@pytest.mark.parametrize(("arguments", "error", "message"), [
    ({"name": "Bad-Name"}, ProjectionDefinitionError, "view name 'Bad-Name' is not valid"),
    ({"inputs": {}}, ProjectionDefinitionError, "give at least one"),
    ({"inputs": {"o": 42}}, ProjectionDefinitionError, "o=42 is not a changelog"),
    ({"key": []}, MissingKeyError, "key=\\[...\\] names the output columns"),
    ({"target": "delta"}, IncompatibleTargetError, "'delta' is not a delta_table"),
    ({"target": delta_table("append")}, IncompatibleTargetError, "keeps every version"),
    ({"target": delta_table("upsert", keys=["id"])}, IncompatibleTargetError,
     r"keyed by \['id'\], the view by \['order_id'\]"),
    ({"query": "  "}, ProjectionDefinitionError, "query= is Spark SQL text"),
    ({"inputs": {"me": "v"}}, ProjectionDefinitionError, "view v reads itself"),
])
def test_a_bad_definition_is_refused_when_it_is_made(arguments: dict[str, Any],
                                                     error: type[Exception],
                                                     message: str) -> None:
    definition: dict[str, Any] = {"name": "v", "inputs": SHOP, "key": ["order_id"],
                                  "query": ORDER_LINES,
                                  "target": delta_table("upsert", keys=["order_id"])}
    with registering_into(Registry()), pytest.raises(error, match=message):
        view(**(definition | arguments))


def test_registry_checks_find_unknown_views_cycles_and_name_clashes() -> None:
    registry = Registry()
    with registering_into(registry):
        view("a", inputs={"x": "b"}, key="k", query="SELECT k FROM x",
             target=delta_table("upsert", keys=["k"]))
        view("b", inputs={"x": "c"}, key="k", query="SELECT k FROM x",
             target=delta_table("upsert", keys=["k"]))
        view("c", inputs={"x": "a"}, key="k", query="SELECT k FROM x",
             target=delta_table("upsert", keys=["k"]))
        with pytest.raises(ProjectionDefinitionError, match="'a' is defined twice"):
            view("a", inputs={"x": "b"}, key="k", query="SELECT k FROM x",
                 target=delta_table("upsert", keys=["k"]))
    with pytest.raises(ProjectionDefinitionError, match="cycle: a → b → c → a"):
        check_views(registry.views)
    lonely = Registry()
    with registering_into(lonely):
        view("a", inputs={"x": "missing"}, key="k", query="SELECT k FROM x",
             target=delta_table("upsert", keys=["k"]))
    with pytest.raises(UnknownSourceError, match="reads view 'missing', which is not "
                                                 "defined; the views are: a"):
        check_views(lonely.views)
    with pytest.raises(ProjectionDefinitionError, match="a view and a projection"):
        check_views(lonely.views, others=("a",))


def test_views_are_checked_against_the_stores_and_spark(spark: Any,
                                                        shop: CaptureConfig) -> None:
    registry = Registry()
    _shop_views(registry)
    checked = plan_views(spark, registry.views, shop.source_dsn)
    assert list(checked) == ["order_lines", "revenue_by_city"]
    lines = checked["order_lines"]
    assert lines.plan.direct == {"orders": ("id",)}
    assert str(lines.output.field("amount").type) == "decimal128(10, 2)"
    # the chained view is checked against order_lines' output, as its stream types it
    assert checked["revenue_by_city"].plan.direct == {"lines": ("city",)}
    assert str(checked["revenue_by_city"].output.field("city").type) == "string"

    def refused(query: str, inputs: dict[str, Any], key: str = "order_id") -> None:
        bad = Registry()
        with registering_into(bad):
            view("bad", inputs=inputs, key=key, query=query,
                 target=delta_table("upsert", keys=[key]))
        plan_views(spark, bad.views, shop.source_dsn)

    with pytest.raises(UnknownSourceError, match=r"input o: no changelog stream "
                                                 r"'public\.nope'"):
        refused("SELECT id AS order_id FROM o", {"o": changelog("nope")})
    with pytest.raises(ProjectionDefinitionError, match=r"does not fit its inputs.*colour"):
        refused("SELECT id AS order_id, colour FROM o", {"o": SHOP["orders"]})
    with pytest.raises(NotMaintainableError, match="GlobalLimit"):
        refused("SELECT id AS order_id FROM o LIMIT 1", {"o": SHOP["orders"]})
    with pytest.raises(IncompatibleTargetError, match="'ids' has type list"):
        refused("SELECT customer_id AS order_id, collect_set(id) AS ids FROM o "
                "GROUP BY customer_id", {"o": SHOP["orders"]})
