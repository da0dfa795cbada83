"""The analysis of a view's query: which partitions a change touches and how each input is
found, or a refusal that names the part of the query and why."""

from __future__ import annotations

import pytest

from lakefold.projections.exceptions import MissingKeyError, NotMaintainableError
from lakefold.projections.plan._view_plan import LookupPath, analyze

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
    assert plan.lookups == {"customers": LookupPath("id", "orders", "customer_id"),
                            "products": LookupPath("id", "orders", "product_id")}
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
    assert plan.lookups == {"orders": LookupPath("customer_id", "customers", "id")}


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
    assert plan.lookups == {"customers": LookupPath("id", "orders", "customer_id")}
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


def test_a_join_without_equal_keys_is_refused_as_such(spark):
    query = "SELECT o.id, p.id AS pid FROM orders o JOIN products p ON o.amount > p.price"
    with pytest.raises(NotMaintainableError, match="are not joined on equal keys"):
        analyze(spark, "v", read_by(query), query, ["id", "pid"])


def test_a_self_join_of_two_inputs_finds_the_second_through_the_first(spark):
    customers = SHOP["customers"]
    plan = analyze(spark, "same_city", {"a": customers, "b": customers}, """
        SELECT a.id, count(b.id) AS same_city FROM a JOIN b ON a.city = b.city
        GROUP BY a.id""", ["id"])
    assert plan.direct == {"a": ("id",)}
    assert plan.lookups == {"b": LookupPath("city", "a", "city")}


@pytest.mark.parametrize("query", [
    "SELECT 1 AS k, count(*) AS n, sum(amount) AS total FROM orders",
    "SELECT n AS k, count(*) AS customers FROM (SELECT customer_id, count(*) AS n "
    "FROM orders GROUP BY customer_id) GROUP BY n",
    "SELECT upper(status) AS k, count(*) AS n FROM orders GROUP BY upper(status)",
])
def test_a_computed_key_recomputes_the_view_whole(spark, query):
    plan = analyze(spark, "v", read_by(" orders"), query, ["k"],
                   input_keys={"orders": ("id",)})
    assert plan.whole and plan.partition == () and plan.direct == {}
    assert "recomputed whole" in plan.describe()


KEYS = {"orders": ("id",), "customers": ("id",), "products": ("id",)}


@pytest.mark.parametrize(("query", "key", "unique"), [
    # each customer meets many orders
    ("SELECT c.id, o.amount FROM customers c JOIN orders o ON o.customer_id = c.id",
     ["id"], False),
    # each order meets one customer
    ("SELECT o.id, c.city FROM orders o JOIN customers c ON o.customer_id = c.id",
     ["id"], True),
    # a grouping column left out of the key, and one its input's key determines
    ("SELECT c.city, p.category, count(*) AS n FROM orders o JOIN customers c "
     "ON o.customer_id = c.id JOIN products p ON o.product_id = p.id "
     "GROUP BY c.city, p.category", ["city"], False),
    ("SELECT c.id, c.name, count(*) AS n FROM customers c JOIN orders o "
     "ON o.customer_id = c.id GROUP BY c.id, c.name", ["id"], True),
    # an inner join's keys determine each other
    ("SELECT o.customer_id, c.name, count(*) AS n FROM orders o JOIN customers c "
     "ON o.customer_id = c.id GROUP BY o.customer_id, c.name", ["customer_id"], True),
    ("SELECT DISTINCT city FROM customers", ["city"], True),
    # a union says nothing: checked as rows come
    ("SELECT id, city FROM customers UNION ALL SELECT id, status AS city FROM orders",
     ["id"], True),
])
def test_a_key_the_plan_shows_is_not_unique_is_refused(spark, query, key, unique):
    def plan() -> None:
        analyze(spark, "v", read_by(query), query, key, input_keys=KEYS)

    if unique:
        plan()
    else:
        with pytest.raises(MissingKeyError,
                           match="may hold several rows: nothing in the query makes it"):
            plan()


def test_a_window_end_follows_from_its_start(spark):
    from lakefold.projections.plan._plan_keys import WindowColumns

    views = {"v": "position bigint, page string, window_start timestamp, "
                  "window_end timestamp"}
    query = ("SELECT window_start, window_end, page, count(*) AS n FROM v "
             "GROUP BY window_start, window_end, page")
    analyze(spark, "w", views, query, ["window_start", "page"],
            input_keys={"v": ("position",)}, window=WindowColumns("v"))
    with pytest.raises(MissingKeyError, match="may hold several rows"):
        analyze(spark, "w", views, query, ["window_start", "page"],
                input_keys={"v": ("position",)})


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
