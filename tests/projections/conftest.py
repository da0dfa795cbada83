"""Fixtures of the view tests: the shop's captured tables and its views."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from lakefold.capture import Capture, CaptureConfig
from lakefold.projections.operators._view_maintainer import ViewMaintainer
from tests.capture.conftest import capture_now, execute
from tests.fixtures.postgres import TestDatabase
from tests.projections.view_shop import SHOP_TABLES, open_views


@pytest.fixture
def shop(pg: TestDatabase) -> CaptureConfig:
    execute(pg.dsn, *SHOP_TABLES)
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
