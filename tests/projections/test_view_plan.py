"""The analysis of a view's query: which partitions a change touches and how each input is
found, or a refusal that names the part of the query and why."""

from __future__ import annotations

import pytest

from lakefold.projections._view_plan import Lookup, analyze
from lakefold.projections.exceptions import MissingKeyError, NotMaintainableError

pytestmark = pytest.mark.timeout(120)

SHOP = {
    "orders": ("id int, customer_id int, product_id int, "
                                 "amount decimal(10,2), status string"),
    "customers": ("id int, name string, city string"),
    "products": ("id int, category string, price decimal(10,2)"),
}


def read_by(query: str) -> dict[str, str]:
    """The shop tables a query names (a view declares only the inputs it reads)."""
    return {name: ddl for name, ddl in SHOP.items() if f" {name}" in query}


LINES = {"lines": ("order_id int, customer_id int, amount decimal(10,2), "
                                     "city string, category string")}


def test_a_foreign_key_join_partitions_by_the_order_and_looks_up_the_rest(spark):
    plan = analyze(spark, "order_lines", read_by("""
        SELECT o.id AS order_id, o.amount, c.city, p.category
        FROM orders o JOIN customers c ON o.customer_id = c.id
        LEFT JOIN products p ON o.product_id = p.id"""), """
        SELECT o.id AS order_id, o.amount, c.city, p.category
        FROM orders o JOIN customers c ON o.customer_id = c.id
        LEFT JOIN products p ON o.product_id = p.id""", ["order_id"])
    assert plan.partition == ("order_id",)
    assert plan.direct == {"orders": ("id",)}
    assert plan.lookups == {"customers": Lookup("id", "orders", "customer_id"),
                            "products": Lookup("id", "orders", "product_id")}
    assert plan.columns == {"order_id": "int", "amount": "decimal(10,2)", "city": "string",
                            "category": "string"}
    assert plan.lookup_columns() == {"orders": {"id", "customer_id", "product_id"},
                                     "customers": {"id"}, "products": {"id"}}


def test_a_group_by_partitions_by_its_groups(spark):
    plan = analyze(spark, "revenue_by_city", LINES, """
        SELECT city, count(*) AS orders, sum(amount) AS revenue, avg(amount) AS average,
               min(amount) AS smallest, max(amount) AS largest,
               count(DISTINCT customer_id) AS customers
        FROM lines GROUP BY city HAVING count(*) > 0""", ["city"])
    assert (plan.partition, plan.direct, plan.lookups) == (("city",), {"lines": ("city",)}, {})


def test_a_group_by_over_a_join_finds_the_grouped_side_first(spark):
    plan = analyze(spark, "by_city", read_by("""
        SELECT c.city, sum(o.amount) AS revenue FROM orders o
        JOIN customers c ON o.customer_id = c.id GROUP BY c.city"""), """
        SELECT c.city, sum(o.amount) AS revenue FROM orders o
        JOIN customers c ON o.customer_id = c.id GROUP BY c.city""", ["city"])
    assert plan.direct == {"customers": ("city",)}
    assert plan.lookups == {"orders": Lookup("customer_id", "customers", "id")}


def test_an_inner_join_key_is_held_by_both_sides(spark):
    plan = analyze(spark, "per_customer", read_by("""
        SELECT o.customer_id, c.name, count(*) AS orders FROM orders o
        JOIN customers c ON o.customer_id = c.id GROUP BY o.customer_id, c.name"""), """
        SELECT o.customer_id, c.name, count(*) AS orders FROM orders o
        JOIN customers c ON o.customer_id = c.id GROUP BY o.customer_id, c.name""",
        ["customer_id"])
    assert plan.direct == {"customers": ("id",), "orders": ("customer_id",)}


def test_a_full_outer_join_partitions_by_the_coalesced_join_key(spark):
    plan = analyze(spark, "customer_orders", read_by("""
        SELECT coalesce(c.id, o.customer_id) AS customer_key, o.id AS order_id, c.name,
               o.amount
        FROM customers c FULL OUTER JOIN orders o ON c.id = o.customer_id"""), """
        SELECT coalesce(c.id, o.customer_id) AS customer_key, o.id AS order_id, c.name,
               o.amount
        FROM customers c FULL OUTER JOIN orders o ON c.id = o.customer_id""",
        ["customer_key", "order_id"])
    assert plan.partition == ("customer_key",)
    assert plan.direct == {"customers": ("id",), "orders": ("customer_id",)}


def test_a_dataframe_function_is_analyzed_like_sql(spark):
    def order_lines(orders, customers):
        return (orders.join(customers, orders.customer_id == customers.id)
                .select(orders.id.alias("order_id"), customers.city,
                        (orders.amount * 2).alias("double")))

    plan = analyze(spark, "order_lines", {k: SHOP[k] for k in ("orders", "customers")},
                   order_lines, ["order_id"])
    assert plan.direct == {"orders": ("id",)}
    assert plan.lookups == {"customers": Lookup("id", "orders", "customer_id")}
    assert plan.columns["double"] == "decimal(12,2)"


def test_an_outer_side_is_never_found_through_the_side_it_may_lack(spark):
    # customers LEFT JOIN orders by customer: customers without orders appear, so customers
    # cannot be found through orders; orders are found through customers.
    plan = analyze(spark, "customer_totals", read_by("""
        SELECT c.id, c.name, sum(o.amount) AS total FROM customers c
        LEFT JOIN orders o ON o.customer_id = c.id GROUP BY c.id, c.name"""), """
        SELECT c.id, c.name, sum(o.amount) AS total FROM customers c
        LEFT JOIN orders o ON o.customer_id = c.id GROUP BY c.id, c.name""", ["id"])
    assert plan.direct == {"customers": ("id",), "orders": ("customer_id",)}
    with pytest.raises(NotMaintainableError, match="optional side of an outer join"):
        analyze(spark, "optional_key", read_by("""
            SELECT o.id AS order_id, c.name FROM customers c
            LEFT JOIN orders o ON o.customer_id = c.id"""), """
            SELECT o.id AS order_id, c.name FROM customers c
            LEFT JOIN orders o ON o.customer_id = c.id""", ["order_id"])


@pytest.mark.parametrize(("query", "message"), [
    ("SELECT * FROM orders LIMIT 3", "GlobalLimit: a LIMIT keeps rows"),
    ("SELECT id, rand() AS r FROM orders", "Rand in Project: it is not deterministic"),
    ("SELECT id, row_number() OVER (PARTITION BY customer_id ORDER BY id) AS rn FROM orders",
     "Window: window functions"),
    ("SELECT id FROM orders WHERE customer_id IN (SELECT id FROM customers)",
     "a subquery in Filter"),
    ("SELECT o.id, p.id AS pid FROM orders o JOIN products p ON o.amount > p.price",
     "no choice of key columns reaches every input"),
    ("SELECT c.city, sum(o.amount) AS revenue FROM orders o JOIN customers c "
     "ON o.customer_id = c.id JOIN products p ON o.product_id = p.id GROUP BY c.city",
     None),
    ("SELECT upper(city) AS city, count(*) AS n FROM customers GROUP BY upper(city)",
     "key column city is computed"),
    ("SELECT a.id FROM orders a JOIN orders b ON a.customer_id = b.customer_id",
     "input orders is read twice"),
])
def test_queries_it_cannot_maintain_are_refused_with_the_reason(spark, query, message):
    key = ["id"] if "a.id" in query or "o.id" in query else \
        ["city"] if "city" in query else ["id"]
    if message is None:  # three inputs, grouped on a lookup's column: still maintainable
        plan = analyze(spark, "v", read_by(query), query, key)
        assert plan.direct == {"customers": ("city",)}
        assert set(plan.lookups) == {"orders", "products"}
        return
    with pytest.raises(NotMaintainableError, match=message):
        analyze(spark, "v", read_by(query), query, key)


def test_keys_and_inputs_that_do_not_fit_are_refused(spark):
    with pytest.raises(MissingKeyError, match="key column nope is not an output column; "
                                              "the output columns are id, city"):
        analyze(spark, "v", read_by(" customers"), "SELECT id, city FROM customers", ["nope"])
    with pytest.raises(MissingKeyError, match="inputs orders, products are not read by the query"):
        analyze(spark, "v", SHOP, "SELECT id, city FROM customers", ["id"])
    with pytest.raises(MissingKeyError, match="needs a key"):
        analyze(spark, "v", {"customers": SHOP["customers"]},
                "SELECT id, city FROM customers", [])
    with pytest.raises(MissingKeyError, match="two columns named id"):
        analyze(spark, "v", {k: SHOP[k] for k in ("orders", "customers")},
                "SELECT o.id, c.id FROM orders o JOIN customers c ON o.customer_id = c.id",
                ["id"])
