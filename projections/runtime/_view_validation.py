"""Views checked against the stores and Spark before anything runs: every table an input names
is captured, the query reads only columns its inputs have, and lakefold can maintain it.

Views are checked in run order, so a view over another view is checked against the columns
the other view outputs, typed as its output stream will type them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg
import pyarrow as pa

from lakefold.projections.definitions._view_api import View, check_views
from lakefold.projections.definitions._windows import WINDOW_END, WINDOW_FINAL, WINDOW_START, Window
from lakefold.projections.exceptions import (
    IncompatibleTargetError,
    MissingKeyError,
    ProjectionDefinitionError,
    UnknownSourceError,
)
from lakefold.projections.operators._lookups import enrichment_fields
from lakefold.projections.operators._view_core import describe_inputs, drift_message
from lakefold.projections.operators._view_events import (
    check_time_column,
    event_schema,
    payload_decoder,
    windowed_schema,
)
from lakefold.projections.operators._view_maintainer import input_schema
from lakefold.projections.plan._plan_keys import WindowColumns
from lakefold.projections.plan._view_plan import ViewPlan, analyze, arrow_output, view_frame
from lakefold.spark.internals import no_duplicate_error_logs
from lakefold.store.exceptions import CaptureValueError, UnknownStreamError
from lakefold.store.internals import arrow_type, column_for, stream_meta

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class CheckedView:
    """A view that passed every check: how it is maintained, and its output's columns as
    its output stream types them."""

    view: View
    plan: ViewPlan
    output: pa.Schema


def _drifted(store_dsn: str, view: View, error: str) -> str:
    tables = {alias: str(s.table) for alias, s in view.inputs.items() if s.table is not None}
    with psycopg.connect(store_dsn, autocommit=True) as conn:
        return drift_message(view.name, error, describe_inputs(conn, tables))


def streamed(schema: pa.Schema) -> pa.Schema:
    """An output schema as a view's output stream reads it back."""
    return pa.schema([pa.field(f.name, arrow_type(column_for(f, key=False))) for f in schema])


def plan_views(spark: SparkSession, views: Mapping[str, View], store_dsn: str,
               others: tuple[str, ...] = (), *, established: Collection[str] = (),
               on_drift: Callable[[str, str], None] | None = None) -> dict[str, CheckedView]:
    """Check every view (see the module docstring); returns them in run order.

    A view in ``established`` (it ran before with this very definition) that no longer fits
    its inputs has not been defined wrongly: an input's schema changed under it. With
    ``on_drift`` it is reported there (view, message naming the column and where the schema
    changed) and left out, with the views downstream of it, instead of refusing them all."""
    from pyspark.errors import AnalysisException, PySparkTypeError, PySparkValueError
    from pyspark.sql.pandas.types import from_arrow_schema

    checked: dict[str, CheckedView] = {}
    left_out: set[str] = set()
    for name in check_views(views, others):
        view = views[name]
        gone = [u for u in view.upstream if u in left_out]
        if gone and on_drift is not None:
            on_drift(name, f"view {name} waits for view {gone[0]}, which no longer fits its "
                     "inputs (see its error)")
            left_out.add(name)
            continue
        schemas = {}
        keys: dict[str, tuple[str, ...]] = {}
        for alias, source in view.inputs.items():
            if source.events is not None:
                decoder = payload_decoder(name, alias, source.events, view.registry)
                window = view.window if view.window and view.window.input == alias else None
                fields = enrichment_fields(store_dsn, name, alias, source.events.lookups,
                                           event_schema(name, alias, decoder))
                schemas[alias] = streamed(event_schema(
                    name, alias, decoder, window, [f for group in fields for f in group]))
                if view.join is not None and alias in (view.join.left, view.join.right):
                    column = view.join.left_time if alias == view.join.left else \
                        view.join.right_time
                    check_time_column(name, alias, schemas[alias], column, "interval join")
            elif source.table is not None:
                try:
                    schemas[alias] = input_schema(store_dsn, source.table)
                except UnknownStreamError as e:
                    raise UnknownSourceError(f"view {name}: input {alias}: {e}") from e
                if view.window is not None and view.window.input == alias:  # a feed's rows
                    schemas[alias] = streamed(windowed_schema(name, alias, schemas[alias],
                                                              view.window))
            else:
                assert source.view is not None  # noqa: S101 - an input is one or the other
                schemas[alias] = checked[source.view].output
        keys = {alias: _input_key(store_dsn, view, alias, checked) for alias in schemas}
        spark_schemas = {alias: from_arrow_schema(s) for alias, s in schemas.items()}
        try:
            with no_duplicate_error_logs():  # the error below says it once
                plan = analyze(spark, name, spark_schemas, view.query, view.key, view.join,
                               _fixed_windows(view), keys,
                               None if view.window is None else
                               WindowColumns(view.window.input, view.window.by))
                output = arrow_output(view_frame(spark, spark_schemas, view.query))
        except (AnalysisException, PySparkTypeError, PySparkValueError) as e:
            if name in established and on_drift is not None:
                on_drift(name, _drifted(store_dsn, view, str(e).splitlines()[0]))
                left_out.add(name)
                continue
            raise ProjectionDefinitionError(
                f"view {name} does not fit its inputs: {str(e).splitlines()[0]}") from e
        if view.window is not None:
            output = _windowed_output(name, output, view.window)
        try:
            checked[name] = CheckedView(view, plan, streamed(output))
        except CaptureValueError as e:
            raise IncompatibleTargetError(f"view {name}: {e}") from e
    return checked


def _input_key(store_dsn: str, view: View, alias: str,
               checked: Mapping[str, CheckedView]) -> tuple[str, ...]:
    """The columns that identify one row of an input as the query reads it: a table's key,
    an event's position, another view's key; a hopping window's rows add their window."""
    source = view.inputs[alias]
    if source.events is not None:
        key: tuple[str, ...] = ("position",)
    elif source.table is not None:
        with psycopg.connect(store_dsn, autocommit=True) as conn:
            latest = stream_meta(conn, source.table).latest
        key = tuple(c.name for c in latest.columns if c.key) if latest is not None else ()
    else:
        assert source.view is not None  # noqa: S101 - an input is one of the three
        key = checked[source.view].plan.key
    window = view.window
    if window is not None and window.input == alias and window.slide < window.size:
        key += (WINDOW_START,)  # an event or row in several windows
    return key


def _fixed_windows(view: View) -> str | None:
    """The event input whose windows have a fixed size (tumbling, hopping, sliding): their
    aggregates can be folded from the feed (``_window_aggregates``)."""
    window = view.window
    if window is None or window.kind == "session" or view.inputs[window.input].events is None:
        return None
    return window.input


def _windowed_output(view: str, output: pa.Schema, window: Window) -> pa.Schema:
    """A windowed view's output: the query's columns and ``window_final``."""
    if window.kind == "session" and WINDOW_END not in output.names:
        raise MissingKeyError(
            f"view {view}: a session-windowed view outputs {WINDOW_END} (select it, and group "
            "by it: a session's end moves as it grows, and says when it is final); its columns "
            f"are {', '.join(output.names)}")
    if WINDOW_START not in output.names:
        raise MissingKeyError(
            f"view {view}: a windowed view outputs {WINDOW_START} (select it, and group by "
            f"it); its columns are {', '.join(output.names)}")
    if not pa.types.is_timestamp(output.field(WINDOW_START).type):
        raise ProjectionDefinitionError(
            f"view {view}: its {WINDOW_START} is {output.field(WINDOW_START).type}, not the "
            "window's start; select the input's window_start as it is")
    if WINDOW_FINAL in output.names:
        raise ProjectionDefinitionError(
            f"view {view}: the query outputs {WINDOW_FINAL}, which lakefold adds to a "
            "windowed view's rows; rename that column")
    return output.append(pa.field(WINDOW_FINAL, pa.bool_()))
