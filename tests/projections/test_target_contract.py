"""The target contract, run against every real target: one line per target in ``CASES``."""

from __future__ import annotations

import pytest

from lakefold.projections.definitions._target_specs import delta_table, redis_cache, search_index
from tests.projections.target_contract import TargetCase, TargetContract

pytestmark = pytest.mark.timeout(120)

CASES = [
    TargetCase("delta-upsert", delta_table("upsert", keys=["id"])),
    TargetCase("redis-hash", redis_cache("id")),
    TargetCase("redis-json", redis_cache("id", format="json")),
    TargetCase("search", search_index("id", text=["name"])),
]


@pytest.fixture(params=CASES, ids=str)
def case(request: pytest.FixtureRequest) -> TargetCase:
    return request.param  # type: ignore[no-any-return]


class TestTargets(TargetContract):
    """Every case of ``CASES`` under the contract."""
