"""Fixtures of the view tests: the shop's captured tables and its views."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from lakefold.capture import Capture, CaptureConfig
from lakefold.projections.operators._view_maintainer import ViewMaintainer
from tests.capture.conftest import capture_now, execute
from tests.fixtures.postgres import TestDatabase
from tests.projections.view_shop import open_views


@pytest.fixture
def shop(pg: TestDatabase) -> CaptureConfig:
    execute(pg.dsn,
            "CREATE TABLE customers (id int PRIMARY KEY, name text, city text)",
            "CREATE TABLE products (id int PRIMARY KEY, category text)",
            "CREATE TABLE orders (id int PRIMARY KEY, customer_id int, product_id int, "
            "amount numeric(10, 2))",
            "INSERT INTO customers SELECT i, 'c' || i, (ARRAY['Oslo', 'Lima'])[i % 2 + 1] "
            "FROM generate_series(1, 6) i",
            "INSERT INTO products SELECT i, 'k' || (i % 2) FROM generate_series(1, 4) i",
            "INSERT INTO orders SELECT i, i % 7, i % 5, i * 1.25 FROM generate_series(1, 15) i")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("customers", "products", "orders"),
                           slot="views")
    Capture(config).setup()
    capture_now(config)
    return config


@pytest.fixture
def shop_views(spark: Any, shop: CaptureConfig) -> Iterator[dict[str, ViewMaintainer]]:
    views = open_views(spark, shop.source_dsn)
    yield views
    for view in views.values():
        view.close()
