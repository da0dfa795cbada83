"""A view's target (real Delta, Redis and Tantivy) follows the view's output stream exactly
once and equals the SQL on the source; a target that cannot hold a view is refused."""

from __future__ import annotations

import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from lakefold.capture import CaptureConfig
from lakefold.projections.definitions._codec import NULL_KEY, key_text
from lakefold.projections.definitions._target_specs import delta_table, redis_cache, search_index
from lakefold.projections.definitions._targets import GenerationTarget, TargetContext
from lakefold.projections.definitions._view_api import check_view_target
from lakefold.projections.exceptions import IncompatibleTargetError
from lakefold.projections.operators._view_maintainer import ViewMaintainer
from lakefold.projections.targets._view_targets import ViewTargetWriter
from tests.capture.conftest import capture_now, execute
from tests.projections.view_shop import oracle, step_views

pytestmark = pytest.mark.timeout(300)


def _delta_rows(path: str, key: str) -> dict[Any, dict[str, Any]]:
    table = DeltaTable(path).to_pyarrow_table()
    return {row[key]: {k: v for k, v in row.items() if not k.startswith("_")}
            for row in table.to_pylist()}


def test_targets_follow_the_views_exactly_once(
        shop: CaptureConfig, shop_views: dict[str, ViewMaintainer], tmp_path: Path,
        redis_url: str) -> None:
    dsn = shop.source_dsn
    context = TargetContext("views", 1, redis_url=redis_url,
                            redis_namespace=f"t{uuid.uuid4().hex[:8]}", null_keys=True)
    lines, revenue = shop_views["order_lines"], shop_views["revenue_by_city"]
    delta = delta_table("upsert", keys=["order_id"]).open(str(tmp_path / "lines"), context)
    search = search_index("order_id", text=["city"]).open(str(tmp_path / "search"), context)
    cache = redis_cache("city").open(f"{context.redis_namespace}:by_city:", context)
    writers = [ViewTargetWriter(dsn, lines.output.name, delta, reader="delta"),
               ViewTargetWriter(dsn, lines.output.name, search, reader="search"),
               ViewTargetWriter(dsn, revenue.output.name, cache, reader="cache")]
    changes = [
        "UPDATE customers SET city = 'Pune' WHERE id = 3",  # a row moves between groups
        "UPDATE customers SET city = NULL WHERE id = 1",  # the group of NULLs, as SQL has it
        "DELETE FROM orders WHERE id IN (4, 5)",
        "UPDATE orders SET customer_id = 1 WHERE id = 8",  # a join key changes
        "DELETE FROM customers WHERE id = 2",  # its orders leave the inner join
        "TRUNCATE products",
        "INSERT INTO orders VALUES (99, 1, 1, 7.50)",
    ]
    try:
        for change in [None, *changes]:
            if change is not None:
                execute(dsn, change)
                capture_now(shop)
            step_views(shop_views)
            for writer in writers:
                writer.step(max_records=4)  # several batches per range: resumable
                while writer.step(max_records=4) is not None:
                    pass
            expected = oracle(dsn, "order_lines")
            held = _delta_rows(delta.location, "order_id")
            assert held == {k[0]: row for k, row in expected.items()}, change
            assert set(search.read([k[0] for k in expected]) or {}) == {
                str(k[0]) for k in expected}
            assert sorted(int(str(k)) for k in search.stored_keys()) == sorted(
                k[0] for k in expected)
            by_city = oracle(dsn, "revenue_by_city")
            cities_now = sorted(key_text(k[0], nulls=True) for k in by_city)
            cached = cache.read([k[0] for k in by_city])
            assert {city: int(row["orders"]) for city, row in cached.items()} == {
                key_text(k[0], nulls=True): row["orders"] for k, row in by_city.items()}, change
            assert sorted(map(str, cache.stored_keys())) == cities_now
        # Nothing is left: each target's checkpoint is the stream's head.
        assert all(writer.step() is None for writer in writers)
        assert delta.checkpoint() == lines.store.head(lines.output.name)
        assert Decimal(str(cached["Pune"]["revenue"])) > 0
        assert int(cached[NULL_KEY]["orders"]) == oracle(dsn, "revenue_by_city")[(None,)][
            "orders"] > 0
    finally:
        for writer in writers:
            writer.close()
        for target in (delta, search, cache):
            target.close()


@pytest.mark.parametrize(("target", "message"), [
    (delta_table("append"), "keeps every version"),
    (delta_table("scd2", keys=["order_id"]), "keeps every version"),
    (delta_table("upsert", keys=["id"]), r"keyed by \['id'\], the view by \['order_id'\]"),
    (redis_cache("city"), r"keyed by \['city'\]"),
])
def test_a_target_that_cannot_hold_a_view_is_refused(target: Any, message: str) -> None:
    with pytest.raises(IncompatibleTargetError, match=message):
        check_view_target("order_lines", ("order_id",), target)


def test_a_writer_resumes_after_its_targets_checkpoint(
        shop: CaptureConfig, shop_views: dict[str, ViewMaintainer], tmp_path: Path) -> None:
    lines = shop_views["order_lines"]
    lines.step()
    context = TargetContext("views", 2)
    path = str(tmp_path / "lines")

    def target() -> GenerationTarget:
        return delta_table("upsert", keys=["order_id"]).open(path, context)

    first = ViewTargetWriter(shop.source_dsn, lines.output.name, target(), reader="lines")
    step = first.step(max_records=5)
    assert step is not None and (step.start, step.end) == (1, 6)
    first.close()
    again = ViewTargetWriter(shop.source_dsn, lines.output.name, target(),  # a restart
                             reader="lines")
    step = again.step()
    assert step is not None and step.start == 6
    assert len(_delta_rows(path, "order_id")) == len(oracle(shop.source_dsn, "order_lines"))
    again.close()
