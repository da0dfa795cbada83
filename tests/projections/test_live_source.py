"""The live source (micro-batches read on the driver) against the partitioned one."""

from __future__ import annotations

import pytest

from lakefold._bench.history import CATEGORY, load_history
from lakefold.projections import Registry, delta_table, projection
from lakefold.projections.definitions._model import events
from lakefold.projections.operations import registering_into
from lakefold.projections.runtime._queries import build
from lakefold.spark._source_live import FORMAT as LIVE_FORMAT, LIVE_READ_MAX, live_frame
from lakefold.spark._source_records import source_frame
from tests.projections import helpers

pytestmark = pytest.mark.timeout(120)


def test_live_source_reads_what_the_partitioned_source_reads(pg, spark, tmp_path):
    load_history(pg.dsn, 30, per_stream=10, customers=3)
    source = events(CATEGORY)
    live = helpers.stream_batches(live_frame(spark, pg.dsn, source, max_records=10),
                                  tmp_path / "a", 30)
    partitioned = helpers.stream_batches(source_frame(spark, pg.dsn, source, max_records=10),
                                         tmp_path / "b", 30)
    assert [len(batch) for batch in live] == [10, 10, 10]
    assert [r["_position"] for batch in live for r in batch] == list(range(1, 31))
    assert [row.asDict() for batch in live for row in batch] == \
        [row.asDict() for batch in partitioned for row in batch]


def _source_formats(plan) -> str:
    return str(plan.output._jdf.queryExecution().logical().toString())


def test_only_small_live_batches_are_read_on_the_driver(pg, spark):
    load_history(pg.dsn, 10, per_stream=10, customers=3)
    registry = Registry()
    with registering_into(registry):
        @projection("totals", sources=[events(CATEGORY)],
                    target=delta_table("upsert", keys=["stream"]))
        def totals(deposits):
            return deposits.groupBy(deposits["_stream"].alias("stream")).count()
    defined = registry.get("totals")
    small = _source_formats(build(spark, defined, pg.dsn, max_records=LIVE_READ_MAX))
    large = _source_formats(build(spark, defined, pg.dsn, max_records=LIVE_READ_MAX + 1))
    rebuild = _source_formats(build(spark, defined, pg.dsn, max_records=10, rebuild=True))
    assert LIVE_FORMAT in small
    assert LIVE_FORMAT not in large and "lakefold_projection_source" in large
    assert LIVE_FORMAT not in rebuild and "lakefold_projection_source" in rebuild
