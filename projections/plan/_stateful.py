"""Refuse transforms that keep state across records of a changelog (issue 18, item 2).

A changelog is a stream of *changes to a table*, not a stream of facts. Spark Structured
Streaming has no retractions: an aggregation, join, deduplication, window function or limit
over a changelog takes each update and delete record as one more input row. ``groupBy("city")
.count()`` then counts a customer again at every update (under its new city, while its old
city keeps it) and counts each delete as a row with a NULL city. The view drifts from the
table silently, so such a transform is refused when the projection is validated (``lakefold
run``, ``lakefold rebuild``, ``Runner.prepare``), before anything is written.

What stays allowed: per-row operators over changelogs (select, filter, withColumn, UDFs,
explode, union, mapInPandas), any operator over event sources only (events are append-only
facts), and folds (``Fold``), whose handlers see each insert, update and delete. A Delta
input (``delta_changes``) is a table's changes too, and is treated as a changelog here.

A filter is per-row, but over a table's changes it drops updates: an update that takes a row
out of ``filter("status = 'open'")`` never reaches the target, and a target that keeps a row
per key (a Delta upsert or SCD2 table, Redis, a search index) would keep the old row for ever.
So into such a target a filter over a changelog may read only values an update cannot change:
the key columns and the change's own metadata (``_type``, ``_deleted``, ...); a filter on
anything else is refused (``check_filters_over_changelogs``), and the same query as a view
is kept right. Into an append target every change is a row, and any filter is fine.

How: the analyzed logical plan of the transform's output is walked; an operator that keeps
state across records (``STATEFUL_OPERATORS``) is refused when a changelog source's leaf (the
streaming relation whose ``source`` option names a changelog) is anywhere below it. A join is
refused when either side reads a changelog, a static side included: the static side is read
again at every micro-batch, so a replay or rebuild would join with other data.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakefold.projections.definitions._api import Projection
from lakefold.projections.exceptions import StatefulChangelogError
from lakefold.spark.internals import ChangelogSource, DeltaSource

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: Logical operators (Spark node names) that keep state across records, and what to call them.
STATEFUL_OPERATORS: dict[str, str] = {
    "Aggregate": "an aggregation (groupBy/agg/count, or a time window)",
    "Deduplicate": "a deduplication (dropDuplicates/distinct)",
    "DeduplicateWithinWatermark": "a deduplication (dropDuplicatesWithinWatermark)",
    "Distinct": "a deduplication (distinct)",
    "Join": "a join",
    "AsOfJoin": "a join",
    "LateralJoin": "a join",
    "Window": "a window function (over a Window spec)",
    "WindowGroupLimit": "a window function (over a Window spec)",
    "GlobalLimit": "a limit",
    "Offset": "an offset",
    "Intersect": "a set operation (intersect)",
    "Except": "a set operation (subtract/exceptAll)",
    "FlatMapGroupsWithState": "per-group state (flatMapGroupsWithState)",
    "FlatMapGroupsInPandasWithState": "per-group state (applyInPandasWithState)",
    "FlatMapGroupsInPandas": "a per-group function (groupBy().applyInPandas)",
    "FlatMapGroupsInArrow": "a per-group function (groupBy().applyInArrow)",
    "FlatMapCoGroupsInPandas": "a co-grouped function (cogroup().applyInPandas)",
    "FlatMapCoGroupsInArrow": "a co-grouped function (cogroup().applyInArrow)",
    "MapGroups": "a per-group function (mapGroups)",
    "CoGroup": "a co-grouped function (cogroup)",
    "TransformWithState": "per-key state (transformWithState)",
    "TransformWithStateInPandas": "per-key state (transformWithStateInPandas)",
    "TransformWithStateInPySpark": "per-key state (transformWithStateInPandas)",
}
_SUBQUERY = "a subquery (a join in disguise)"


@dataclass(frozen=True)
class StatefulUse:
    """One stateful operator and the changelog tables read below it."""

    operator: str
    description: str
    tables: tuple[str, ...]


def _java_seq(seq: Any) -> Iterator[Any]:
    for index in range(seq.size()):
        yield seq.apply(index)


def _leaf_changelog(node: Any) -> str | None:
    """The changelog table a leaf reads, from its ``source`` option (see ``_source``)."""
    for attribute in ("extraOptions", "options"):
        getter = getattr(node, attribute, None)
        if getter is None:
            continue
        try:
            text = getter().get("source")
        except Exception:  # noqa: S112 - not every leaf has options of this shape
            continue
        if not text:
            continue
        try:
            source = json.loads(str(text))
        except ValueError:
            return None
        if isinstance(source, dict) and source.get("kind") == "changelog":
            return str(source.get("table"))
        if isinstance(source, dict) and source.get("kind") == "delta":  # a table's changes too
            return f"delta table {source.get('uri')}"
        return None
    return None


def _walk(node: Any, found: list[StatefulUse]) -> set[str]:
    """The changelog tables read below ``node`` (itself included); stateful operators over
    one of them are appended to ``found``, innermost first."""
    tables: set[str] = set()
    children = list(_java_seq(node.children()))
    if not children:
        table = _leaf_changelog(node)
        if table is not None:
            tables.add(table)
    for child in children:
        tables |= _walk(child, found)
    subqueries = list(_java_seq(node.subqueries()))
    for subquery in subqueries:
        tables |= _walk(subquery, found)
    name = str(node.nodeName())
    description = STATEFUL_OPERATORS.get(name) or (_SUBQUERY if subqueries else None)
    if description is not None and tables:
        found.append(StatefulUse(name, description, tuple(sorted(tables))))
    return tables


def _filtered_columns(node: Any, keys: Mapping[str, tuple[str, ...]], stable: set[int],
                      found: list[tuple[str, str]]) -> set[str]:
    """The changelog tables read below ``node``; for each filter over one of them whose
    condition reads a column other than the tables' ``keys`` and metadata columns (whose
    attribute ids are ``stable``, added here from the leaves' outputs), ``(table, column)``
    is appended to ``found``."""
    tables: set[str] = set()
    children = list(_java_seq(node.children()))
    if not children:
        table = _leaf_changelog(node)
        if table is not None:
            tables.add(table)
            for attribute in _java_seq(node.output()):
                name = str(attribute.name())
                if name.startswith("_") or name in keys.get(table, ()):
                    stable.add(int(attribute.exprId().id()))
    for child in children:
        tables |= _filtered_columns(child, keys, stable, found)
    if str(node.nodeName()) == "Filter" and tables:
        for attribute in _java_seq(node.condition().references().toSeq()):
            if int(attribute.exprId().id()) not in stable:
                found.append((", ".join(sorted(tables)), str(attribute.name())))
    return tables


def check_filters_over_changelogs(projection: Projection, output: DataFrame,
                                  keys: Mapping[str, tuple[str, ...]]) -> None:
    """Raise StatefulChangelogError when ``projection``'s transform filters a changelog (or a
    Delta input's changes) on a column an update can change and its target keeps a row per
    key (see the module docstring). ``keys``: each changelog table's (and Delta input's
    label's) key columns."""
    if projection.fold is not None or getattr(projection.target, "mode", None) == "append":
        return
    if not any(isinstance(s, ChangelogSource | DeltaSource) for s in projection.sources):
        return
    found: list[tuple[str, str]] = []
    try:
        _filtered_columns(output._jdf.queryExecution().analyzed(), keys, set(), found)
    except Exception:  # a plan that cannot be inspected is not refused for this
        return
    if not found:
        return
    table, column = found[0]
    key = ", ".join(keys.get(table, ())) or "its key"
    raise StatefulChangelogError(
        f"projection {projection.name}: its transform filters the changelog of {table} on "
        f"{column}, which an update can change: an update that takes a row out of the filter "
        f"would never reach {projection.target.describe()}, which would keep the old row. "
        f"Filter on the key ({key}) or on _type/_deleted only; or write it as a view "
        "(lakefold.view, the same query, kept equal to the table under updates and deletes); "
        "or write every change to delta_table('append').")


def stateful_changelog_uses(output: DataFrame) -> list[StatefulUse] | None:
    """Stateful operators of ``output``'s plan that read a changelog (innermost first);
    None when the plan cannot be inspected."""
    try:
        plan = output._jdf.queryExecution().analyzed()
        found: list[StatefulUse] = []
        _walk(plan, found)
    except Exception:
        return None
    return found


def check_no_state_over_changelogs(projection: Projection, output: DataFrame,
                                   stateful: bool) -> None:
    """Raise StatefulChangelogError when ``projection``'s transform keeps state across the
    records of a changelog source (see the module docstring). ``stateful``: whether the plan
    keeps any state at all (used when the plan cannot be inspected: then any state over a
    projection that reads a changelog is refused)."""
    if projection.fold is not None:
        return
    changelogs = [s.table if isinstance(s, ChangelogSource) else s.label
                  for s in projection.sources if isinstance(s, ChangelogSource | DeltaSource)]
    if not changelogs:
        return
    uses = stateful_changelog_uses(output)
    if uses is None:
        if not stateful:
            return
        uses = [StatefulUse("?", "an operator that keeps state across records",
                            tuple(changelogs))]
    if not uses:
        return
    use = uses[0]
    tables = ", ".join(use.tables)
    raise StatefulChangelogError(
        f"projection {projection.name}: its transform applies {use.description} (Spark "
        f"operator {use.operator}) to the changelog of {tables}. Spark streaming has no "
        "retractions: every update and delete of a changelog arrives as a new row, so the "
        "view would count old versions and deleted rows again and drift from the table "
        "without any error. Write it as a view (lakefold.view): the same query, in Spark SQL "
        "or as a DataFrame function, kept equal to the table under updates and deletes, as "
        "order_lines and revenue_by_city in lakefold/demo/projections.py are; or as a Fold "
        "(lakefold.projections.Fold), whose handlers see each insert, update and delete and "
        "keep per-key state; or project the rows as they are (select/filter, into "
        "delta_table('upsert', keys=[<the table's key>])) and aggregate or join them with "
        "`lakefold query`."
    )
