"""Views checked against the stores and Spark before anything runs: every table an input names
is captured, the query reads only columns its inputs have, and lakefold can maintain it.

Views are checked in run order, so a view over another view is checked against the columns
the other view outputs, typed as its output stream will type them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from lakefold.capture.store._arrow_columns import arrow_type
from lakefold.capture.store._derived_streams import column_for
from lakefold.capture.store.exceptions import CaptureValueError, UnknownStreamError
from lakefold.projections._view_api import View, check_views
from lakefold.projections._view_events import event_schema
from lakefold.projections._view_maintainer import input_schema
from lakefold.projections._view_plan import ViewPlan, analyze, view_frame
from lakefold.projections.exceptions import (
    IncompatibleTargetError,
    ProjectionDefinitionError,
    UnknownSourceError,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class CheckedView:
    """A view that passed every check: how it is maintained, and its output's columns as
    its output stream types them."""

    view: View
    plan: ViewPlan
    output: pa.Schema


def streamed(schema: pa.Schema) -> pa.Schema:
    """An output schema as a view's output stream reads it back."""
    return pa.schema([pa.field(f.name, arrow_type(column_for(f, key=False))) for f in schema])


def plan_views(spark: SparkSession, views: Mapping[str, View], store_dsn: str,
               others: tuple[str, ...] = ()) -> dict[str, CheckedView]:
    """Check every view (see the module docstring); returns them in run order."""
    from pyspark.errors import AnalysisException, PySparkTypeError, PySparkValueError
    from pyspark.sql.pandas.types import from_arrow_schema

    checked: dict[str, CheckedView] = {}
    for name in check_views(views, others):
        view = views[name]
        schemas = {}
        for alias, source in view.inputs.items():
            if source.events is not None:
                schemas[alias] = streamed(event_schema(name, alias, source.events,
                                                       view.registry))
            elif source.table is not None:
                try:
                    schemas[alias] = input_schema(store_dsn, source.table)
                except UnknownStreamError as e:
                    raise UnknownSourceError(f"view {name}: input {alias}: {e}") from e
            else:
                assert source.view is not None  # noqa: S101 - an input is one or the other
                schemas[alias] = checked[source.view].output
        spark_schemas = {alias: from_arrow_schema(s) for alias, s in schemas.items()}
        try:
            plan = analyze(spark, name, spark_schemas, view.query, view.key)
            output = view_frame(spark, spark_schemas, view.query).toArrow().schema
        except (AnalysisException, PySparkTypeError, PySparkValueError) as e:
            raise ProjectionDefinitionError(
                f"view {name} does not fit its inputs: {str(e).splitlines()[0]}") from e
        try:
            checked[name] = CheckedView(view, plan, streamed(output))
        except CaptureValueError as e:
            raise IncompatibleTargetError(f"view {name}: {e}") from e
    return checked
