"""From a projection definition to the streaming DataFrame Spark runs, and the checks that
need Spark and the live stores (``validate``), run before anything starts.

``build`` gives the output DataFrame of one generation: the source frames (one streaming
source per input, see ``spark._source_records``), then the user's transform or the fold.
``validate`` builds the same plan without starting it, so unknown sources, missing keys and
incompatible targets fail with a clear error first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakefold.core.exceptions import LakefoldError
from lakefold.projections.definitions._api import STREAM_KEY, Projection, Registry
from lakefold.projections.definitions._model import (
    DELETED_COLUMN,
    POSITION_COLUMN,
)
from lakefold.projections.definitions._truncate import (
    FOLD_KEY_COLUMN,
    check_fold_truncates,
    check_truncatable,
    source_mode,
)
from lakefold.projections.exceptions import (
    IncompatibleTargetError,
    MissingKeyError,
    ProjectionDefinitionError,
)
from lakefold.projections.operators._fold import DEAD_LETTER_COLUMN, apply_fold, fold_input
from lakefold.projections.plan._input_checks import check_sources_exist
from lakefold.projections.plan._pruning import event_columns_read
from lakefold.projections.plan._stateful import (
    check_filters_over_changelogs,
    check_no_state_over_changelogs,
)
from lakefold.spark.internals import (
    LIVE_READ_MAX,
    ChangelogSource,
    CutGroup,
    DeltaSource,
    EventSource,
    TruncateOptions,
    live_frame,
    source_frame,
    source_reads,
    spark_schema,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Logical operators that keep state across micro-batches.
_STATEFUL = ("Aggregate", "Deduplicate", "FlatMapGroupsWithState", "FlatMapGroupsInPandas",
             "TransformWithState", "Join", "Window", "Distinct")


@dataclass(frozen=True)
class Plan:
    """A projection's output DataFrame and what the runner needs to know about it."""

    output: DataFrame
    stateful: bool
    columns: tuple[str, ...]
    types: Mapping[str, str]


def _call_transform(projection: Projection, frames: Mapping[str, DataFrame]) -> Any:
    transform = projection.transform
    assert transform is not None  # noqa: S101
    if len(projection.sources) == 1:
        return transform(frames[projection.sources[0].alias])
    return transform(**frames)


def is_stateful(df: DataFrame) -> bool:
    """True when the plan holds operators that keep state across micro-batches."""
    try:
        plan = df._jdf.queryExecution().analyzed().toString()
    except Exception:
        return True
    return any(line.lstrip(" :+-~").startswith(_STATEFUL) for line in plan.splitlines())


def build(spark: SparkSession, projection: Projection, dsn: str, *, max_records: int,
          retries: DataFrame | None = None, rebuild: bool = False,
          generation: int | None = None) -> Plan:
    """The streaming output of ``projection`` reading ``dsn``'s stores. A live generation's
    small batches are read on the driver (``_source_live``); a ``rebuild``'s large ones in
    parallel tasks (``_source_records``), and its event sources fetch only the columns the
    transform reads (see ``_pruning``). Live batches larger than ``LIVE_READ_MAX`` are read in
    tasks too: a driver-side read holds the whole batch in the driver's memory. Changelog
    sources hand over truncate records as the target needs them (see ``_truncate``); a fold's
    are fanned out to the keys of ``generation`` (not at all without one: a plan only validated)."""
    check_truncatable(projection)
    columns = event_columns_read(
        spark, projection, {s.alias: spark_schema(dsn, s) for s in projection.sources},
        _call_transform, source_reads.event_columns()) if rebuild else {}
    tables = tuple(s.table for s in projection.sources if isinstance(s, ChangelogSource))
    cuts = CutGroup.new(f"{projection.name}@{generation}", tables) \
        if projection.fold is not None and len(tables) > 1 else None
    truncates = TruncateOptions(mode=source_mode(projection), fold=projection.name,
                                generation=generation, cuts=cuts)
    if rebuild or max_records > LIVE_READ_MAX:
        frames = {s.alias: source_frame(spark, dsn, s, max_records=max_records,
                                        columns=columns.get(s.alias), truncates=truncates)
                  for s in projection.sources}
    else:
        frames = {s.alias: live_frame(spark, dsn, s, max_records=max_records,
                                      truncates=truncates)
                  for s in projection.sources}
    if projection.fold is not None:
        output = apply_fold(projection, fold_input(projection, frames, retries))
        stateful = True
    else:
        output = _call_transform(projection, frames)
        from pyspark.sql import DataFrame as SparkDataFrame

        if not isinstance(output, SparkDataFrame):
            raise ProjectionDefinitionError(
                f"projection {projection.name}: the transform returned "
                f"{type(output).__name__}, not a DataFrame"
            )
        stateful = is_stateful(output)
        check_no_state_over_changelogs(projection, output, stateful)
        check_filters_over_changelogs(projection, output, _source_keys(projection, dsn))
    types = {f.name: f.dataType.simpleString() for f in output.schema.fields}
    return Plan(output=output, stateful=stateful, columns=tuple(output.columns), types=types)


def _source_keys(projection: Projection, dsn: str) -> dict[str, tuple[str, ...]]:
    """The key columns of each changelog and Delta input, by the name the plan's leaves give
    them (``_stateful._leaf_changelog``)."""
    keys: dict[str, tuple[str, ...]] = {}
    for source in projection.sources:
        if isinstance(source, ChangelogSource):
            try:
                keys[source.table] = source_reads.changelog_key_columns(dsn, source.table)
            except LakefoldError:  # not captured: check_sources_exist says so
                keys[source.table] = ()
        elif isinstance(source, DeltaSource):
            keys[f"delta table {source.uri}"] = tuple(source.key)
    return keys


def check_target(projection: Projection, plan: Plan) -> None:
    """Refuse outputs the target cannot take."""
    columns = [c for c in plan.columns if c not in (DEAD_LETTER_COLUMN, FOLD_KEY_COLUMN)]
    target = projection.target
    if POSITION_COLUMN in columns and plan.types[POSITION_COLUMN] not in ("bigint", "int"):
        raise IncompatibleTargetError(
            f"projection {projection.name}: _position must be an integer column, not "
            f"{plan.types[POSITION_COLUMN]}"
        )
    if DELETED_COLUMN in columns and plan.types[DELETED_COLUMN] != "boolean":
        raise IncompatibleTargetError(
            f"projection {projection.name}: _deleted must be a boolean column, not "
            f"{plan.types[DELETED_COLUMN]}"
        )
    target.check_output(projection, columns, plan.types, stateful=plan.stateful)


def _check_fold_keys(projection: Projection, dsn: str) -> None:
    fold = projection.fold
    if fold is None:
        return
    if not fold.handlers:
        raise ProjectionDefinitionError(
            f"fold {projection.name} has no handlers; add one with @{projection.name}.on(...)"
        )
    check_fold_truncates(projection)
    for source in projection.sources:
        field = fold.key[source.alias] if isinstance(fold.key, Mapping) else fold.key
        if field == STREAM_KEY or not isinstance(source, ChangelogSource | DeltaSource):
            continue
        columns = spark_schema(dsn, source).fieldNames()
        if field not in columns:
            where = source.table if isinstance(source, ChangelogSource) else source.label
            raise MissingKeyError(
                f"fold {projection.name}: key field {field!r} is not a column of "
                f"{where}; its columns are {[c for c in columns if not c.startswith('_')]}"
            )
    for source in projection.sources:
        if not isinstance(source, EventSource):
            continue
        field = fold.key[source.alias] if isinstance(fold.key, Mapping) else fold.key
        for type_name, (_, event_class) in fold.handlers.items():
            fields = getattr(event_class, "model_fields", None)
            if field != STREAM_KEY and isinstance(fields, Mapping) and field not in fields:
                raise MissingKeyError(
                    f"fold {projection.name}: key field {field!r} is not a field of "
                    f"{type_name} ({', '.join(fields)})"
                )


PlanFactory = Callable[[Projection], Plan]


def validate(spark: SparkSession, registry: Registry, dsn: str,
             factory: PlanFactory | None = None) -> dict[str, Plan]:
    """Check every projection against the live stores and Spark: sources exist, keys exist,
    the output suits the target. Returns the plans (not started), built by ``factory`` (by
    default with a read limit of one record)."""
    from pyspark.errors import AnalysisException, PySparkTypeError, PySparkValueError

    plans = {}
    for projection in registry:
        registered = [name for s in projection.sources if isinstance(s, EventSource)
                      for name in s.declared]
        if projection.fold is not None:
            registered += [t for t, (_, cls) in projection.fold.handlers.items()
                           if cls is not None]
        check_sources_exist(dsn, projection.sources, projection=projection.name,
                            registered_types=registered)
        _check_fold_keys(projection, dsn)
        try:
            plan = factory(projection) if factory is not None else \
                build(spark, projection, dsn, max_records=1)
        except (AnalysisException, PySparkTypeError, PySparkValueError) as e:
            # Spark's own verdict on the user's transform (a missing column, a parse error,
            # a wrong argument): the definition does not fit, whatever the data.
            raise ProjectionDefinitionError(
                f"projection {projection.name} does not fit its sources: "
                f"{str(e).splitlines()[0]}"
            ) from e
        check_target(projection, plan)
        plans[projection.name] = plan
    return plans
