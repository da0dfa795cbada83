"""Every validation error: at registration (no store needed) and against the live stores and
Spark before anything runs."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from lakefold.projections import (
    Fold,
    ProjectionOptions,
    Registry,
    Runner,
    RunnerConfig,
    changelog,
    delta_table,
    events,
    load_projections,
    projection,
    redis_cache,
    search_index,
)
from lakefold.projections.exceptions import (
    IncompatibleTargetError,
    MissingKeyError,
    ProjectionDefinitionError,
    ProjectionNotFoundError,
    UnknownSourceError,
)
from lakefold.projections.operations import Catalog, SinkRoots, registering_into
from lakefold.projections.runtime._queries import validate
from tests.projections import helpers

pytestmark = pytest.mark.timeout(120)


def identity(df):
    return df


def test_static_definition_errors():
    with registering_into(Registry()):
        with pytest.raises(ProjectionDefinitionError, match="name 'Bad-Name' is not valid"):
            projection("Bad-Name", sources=[events("order")], target=redis_cache(key="id"))
        with pytest.raises(ProjectionDefinitionError, match="at least one changelog"):
            projection("p", sources=[], target=redis_cache(key="id"))
        with pytest.raises(ProjectionDefinitionError, match="is not a changelog"):
            projection("p", sources=["orders"], target=redis_cache(key="id"))  # type: ignore[list-item]
        with pytest.raises(ProjectionDefinitionError, match="both named 'order'"):
            projection("p", sources=[events("order"), events("order", types=["X"])],
                       target=redis_cache(key="id"))
        with pytest.raises(IncompatibleTargetError, match="is not a delta_table"):
            projection("p", sources=[events("order")], target="redis")  # type: ignore[arg-type]
        projection("p", sources=[events("order")], target=redis_cache(key="id"))(identity)
        with pytest.raises(ProjectionDefinitionError, match="'p' is defined twice"):
            projection("p", sources=[events("order")], target=redis_cache(key="id"))(identity)
    with pytest.raises(MissingKeyError, match="key='<column>'"):
        redis_cache(key="")
    with pytest.raises(MissingKeyError, match="needs keys"):
        delta_table("upsert")
    with pytest.raises(IncompatibleTargetError, match="mode 'merge' is unknown"):
        delta_table("merge")  # type: ignore[arg-type]
    with pytest.raises(IncompatibleTargetError, match="at least one column"):
        search_index(key="id", text=[])
    with pytest.raises(IncompatibleTargetError, match="cannot also be a tokenized"):
        search_index(key="id", text=["id"])
    with pytest.raises(ProjectionDefinitionError, match="on_error='retry' is unknown"):
        ProjectionOptions(on_error="retry")  # type: ignore[arg-type]
    with pytest.raises(ProjectionDefinitionError, match="retries must be >= 1"):
        ProjectionOptions(retries=0)
    with pytest.raises(ProjectionDefinitionError, match="needs a table name"):
        changelog("")


def test_fold_definition_errors():
    with registering_into(Registry()):
        with pytest.raises(MissingKeyError, match="must map every source alias"):
            Fold("f", sources=[events("order"), events("cart")], key={"order": "id"},
                 schema="id string", target=redis_cache(key="id"))
        with pytest.raises(MissingKeyError, match="key_column="):
            Fold("f", sources=[events("order")], key="$stream", schema="id string",
                 target=redis_cache(key="id"))
        with pytest.raises(MissingKeyError, match="keyed by 'id' but the fold emits its key"):
            Fold("f", sources=[events("order")], key="customer", schema="customer string",
                 target=redis_cache(key="id"))
        with pytest.raises(MissingKeyError, match="must include the fold's key column"):
            Fold("f", sources=[events("order")], key="customer", schema="customer string",
                 target=delta_table("upsert", keys=["id"]))
        with pytest.raises(ProjectionDefinitionError, match="Spark DDL string"):
            Fold("f", sources=[events("order")], key="customer", schema="",
                 target=redis_cache(key="customer"))
        fold = Fold("f", sources=[events("order", types=["OrderPlaced"])], key="customer",
                    schema="customer string", target=redis_cache(key="customer"))
        with pytest.raises(ProjectionDefinitionError, match=r"only deliver \['OrderPlaced'\]"):
            fold.on("OrderShipped")(lambda state, record: state)
        fold.on("OrderPlaced")(lambda state, record: state)
        with pytest.raises(ProjectionDefinitionError, match="two handlers for 'OrderPlaced'"):
            fold.on("OrderPlaced")(lambda state, record: state)


def test_loading_errors(tmp_path):
    with pytest.raises(ProjectionNotFoundError, match="does not exist"):
        load_projections(str(tmp_path / "missing.py"))
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(ProjectionNotFoundError, match="defines no projections"):
        load_projections(str(empty))
    with pytest.raises(ProjectionNotFoundError, match="cannot be imported"):
        load_projections("no_such_module_anywhere")


def live_registry(define: Callable[[], object]) -> Registry:
    registry = Registry()
    with registering_into(registry):
        define()
    return registry


LIVE_CASES = {
    "unknown changelog stream": (
        lambda: projection("p", sources=[changelog("public.nope")],
                           target=redis_cache(key="id"))(identity),
        UnknownSourceError, "no changelog stream for table public.nope; captured tables: none"),
    "unknown event type": (
        lambda: projection("p", sources=[events("order", types=["OrderLost"])],
                           target=redis_cache(key="id"))(identity),
        UnknownSourceError, "event type 'OrderLost'.*known types: OrderPlaced"),
    "missing target key": (
        lambda: projection("p", sources=[events("order")], target=redis_cache(key="customer"))(
            lambda df: df.select("stream_id")),
        MissingKeyError, "key column 'customer' is not in the output"),
    "text column not a string": (
        lambda: projection("p", sources=[events("order")],
                           target=search_index(key="stream_id", text=["stream_version"]))(
            identity),
        IncompatibleTargetError, "'stream_version' is bigint, not a string"),
    "stateful into append": (
        lambda: projection("p", sources=[events("order")], target=delta_table("append"))(
            lambda df: df.groupBy("type").count()),
        IncompatibleTargetError, "keeps state"),
    "nested into a hash": (
        lambda: projection("p", sources=[events("order")], target=redis_cache(key="stream_id"))(
            lambda df: df.select("stream_id", F.struct("type").alias("nested"))),
        IncompatibleTargetError, "nested"),
    "column that does not exist": (
        lambda: projection("p", sources=[events("order")], target=redis_cache(key="id"))(
            lambda df: df.select("no_such_column")),
        ProjectionDefinitionError, "does not fit its sources"),
    "transform returns no DataFrame": (
        lambda: projection("p", sources=[events("order")], target=redis_cache(key="id"))(
            lambda df: None),
        ProjectionDefinitionError, "returned NoneType, not a DataFrame"),
    "fold without handlers": (
        lambda: Fold("p", sources=[events("order")], key="customer", schema="customer string",
                     target=redis_cache(key="customer")),
        ProjectionDefinitionError, "has no handlers"),
}


@pytest.mark.parametrize("case", list(LIVE_CASES))
def test_live_validation_errors(case, pg, spark, tmp_path):
    helpers.append_orders(pg.dsn, random.Random(1), 2)
    define, error, message = LIVE_CASES[case]
    registry = live_registry(define)
    with pytest.raises(error, match=message):
        validate(spark, registry, pg.dsn)


def test_an_invalid_projection_registers_nothing(pg, spark, redis_url, tmp_path):
    helpers.append_orders(pg.dsn, random.Random(1), 2)
    registry = live_registry(LIVE_CASES["unknown changelog stream"][0])
    runner = Runner(spark, registry, RunnerConfig(store_dsn=pg.dsn, redis_url=redis_url,
                                                  roots=SinkRoots.under(Path(tmp_path))))
    try:
        with pytest.raises(UnknownSourceError):
            runner.prepare()
    finally:
        runner.close()
    catalog = Catalog(pg.dsn)
    assert catalog.projections() == []
    catalog.close()
