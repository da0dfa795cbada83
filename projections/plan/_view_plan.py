"""How a view is maintained: read off the query's plan, before anything runs.

A view is kept up to date by recomputing, per batch, only the *partitions* a change touches
(see ``operators._recompute``). A partition is a value of some of the view's key columns, ``P``,
chosen so that every output row with a given ``P`` value depends only on input rows that can be
found from that value:

- a **direct** input has, for every column of ``P``, a column that holds the same value in every
  input row that contributes to an output row (``SELECT city, count(*) ... GROUP BY city``: the
  input's ``city``; a join's key on both sides of an inner join);
- a **lookup** input is joined on equal keys to an input found before it, and can contribute
  to an output row only together with a row of that input (the customers of an order, the
  products of an order line; not the preserved side of an outer join).

A change to a direct input touches the partitions of its before- and after-images; a change
to a lookup input touches the partitions of the rows it joins with, looked up in the current
state of the input it is joined to. Recomputing a partition reads the direct inputs' rows of
that partition and the lookup inputs' rows joined to those, then runs the user's query over
them with Spark.

The analysis walks Spark's analyzed logical plan (its JSON form) and tracks, per output
column, the input columns it always equals (``Column.sources``) and whether an outer join may
make it NULL. It refuses what this cannot maintain, naming the part and why: LIMIT and
sampling, window functions, subqueries, non-deterministic functions, an input read twice
(a self-join names the table twice, as two inputs), and any query where no choice of ``P``
reaches every input while some key column is an input's. A view whose key columns are all
computed (a global aggregate's constant, an aggregate of an aggregate) has no partitions
(``ViewPlan.whole``): every batch recomputes it whole.

**One decision, made here**: ``ViewPlan.operator`` says which operator maintains the view —
recompute the touched partitions (``RECOMPUTE``; ``WINDOWED`` when an input is windowed), keep
one ``GROUP BY``'s aggregates by their changes (``KEPT_AGGREGATE``), fold a windowed event
input's rows straight into its aggregates (``WINDOW_FOLD``), or join two event inputs within a
time bound (``INTERVAL_JOIN``). The maintainer executes the tag; it never decides again.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Final

from lakefold.projections.definitions._view_api import Query
from lakefold.projections.definitions._view_inputs import IntervalJoin
from lakefold.projections.definitions._windows import WINDOW_END
from lakefold.projections.exceptions import MissingKeyError, NotMaintainableError
from lakefold.projections.plan._aggregate_plan import AggregatePlan, aggregate_plan
from lakefold.projections.plan._join_bounds import bound_join
from lakefold.projections.plan._local_plan import LocalPlan, local_plan
from lakefold.projections.plan._plan_keys import WindowColumns, check_key
from lakefold.projections.plan._plan_trees import (
    Node,
    conjuncts,
    expr_id,
    expression_trees,
    plan_tree,
    walk,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

#: (input name, column)
InputColumn = tuple[str, str]

_REFUSED_NODES = {
    "GlobalLimit": "a LIMIT keeps rows chosen among all of them",
    "LocalLimit": "a LIMIT keeps rows chosen among all of them",
    "Tail": "a TAIL keeps rows chosen among all of them",
    "Offset": "an OFFSET skips rows counted among all of them",
    "Sample": "a sample is random",
    "Window": "window functions (row_number, rank, lag, running sums) are not maintained yet; "
              "aggregate with GROUP BY instead, or chain a view per step",
    "Expand": "GROUPING SETS, ROLLUP and CUBE are not maintained yet; write one view per "
              "grouping",
    "Repartition": None, "RepartitionByExpression": None,
}
_NONDETERMINISTIC = {
    "Rand", "Randn", "Uuid", "Shuffle", "MonotonicallyIncreasingID", "SparkPartitionID",
    "InputFileName", "InputFileBlockStart", "InputFileBlockLength", "CurrentTimestamp", "Now",
    "CurrentDate", "LocalTimestamp", "CurrentBatchTimestamp", "First", "Last", "AnyValue",
    "CollectList", "RandStr", "Randint",
}
_SUBQUERIES = {"ListQuery", "ScalarSubquery", "Exists", "InSubquery", "LateralSubquery"}
_PASS_THROUGH = {"SubqueryAlias", "Filter", "Sort", "Distinct", "Deduplicate",
                 "Repartition", "RepartitionByExpression", "ResolvedHint"}


@dataclass(frozen=True)
class Column:
    """What the analysis knows of one output column of a plan node."""

    name: str
    #: Input columns whose value this column has in every contributing input row.
    sources: frozenset[InputColumn] = frozenset()
    #: True when an outer join may make it NULL (no row of its input contributed).
    outer_null: bool = False


@dataclass(frozen=True)
class LookupPath:
    """How a lookup input's rows are found: those whose ``column`` equals ``via``'s
    ``via_column`` (not ``definitions.Lookup``, the enrichment a user writes)."""

    column: str
    via: str
    via_column: str


class Operator(StrEnum):
    """Which operator maintains a view (see the module docstring)."""

    RECOMPUTE = "recompute"
    WINDOWED = "windowed"
    KEPT_AGGREGATE = "kept_aggregate"
    WINDOW_FOLD = "window_fold"
    INTERVAL_JOIN = "interval_join"


@dataclass(frozen=True)
class ViewPlan:
    """How one view is maintained (see the module docstring)."""

    #: The view's output columns (name → Spark type, ``simpleString``).
    columns: Mapping[str, str]
    key: tuple[str, ...]
    #: The partition columns (a subset of the key).
    partition: tuple[str, ...]
    #: Direct input → its column for each partition column, in ``partition`` order.
    direct: Mapping[str, tuple[str, ...]]
    #: Lookup input → how its rows are found, in the order they must be found.
    lookups: Mapping[str, LookupPath]
    #: Set when the view is one GROUP BY kept by its changes (``KEPT_AGGREGATE``) or folded
    #: from its windowed event input (``WINDOW_FOLD``); None for every other operator.
    aggregate: AggregatePlan | None = None
    #: Set for a join of two event inputs within a time bound (``INTERVAL_JOIN``).
    join: IntervalJoin | None = None
    #: The operator that maintains the view, decided here once.
    operator: Operator = Operator.RECOMPUTE
    #: The query as Arrow runs it in the process (``_local_plan``), for batches of at most
    #: ``LOCAL_ROWS`` input rows; None: every recompute runs on Spark.
    local: LocalPlan | None = None

    @property
    def inputs(self) -> tuple[str, ...]:
        return (*self.direct, *self.lookups)

    @property
    def whole(self) -> bool:
        """True when the view has no partitions: its key is computed (a global aggregate's
        constant, an aggregate of an aggregate's value), so every batch recomputes it all."""
        return not self.partition

    def lookup_columns(self) -> dict[str, set[str]]:
        """Input → the columns its state is looked up by (they get an index)."""
        wanted: dict[str, set[str]] = {name: set(cols) for name, cols in self.direct.items()}
        for name, lookup in self.lookups.items():
            wanted.setdefault(name, set()).add(lookup.column)
            wanted.setdefault(lookup.via, set()).add(lookup.via_column)
        return wanted

    def describe(self) -> str:
        if self.whole:
            return "recomputed whole by every batch (its key is computed, not an input's)"
        parts = [f"partitions by {', '.join(self.partition)}"]
        parts += [f"{name} direct by {', '.join(cols)}" for name, cols in self.direct.items()]
        parts += [f"{name} looked up by {lookup.column} = {lookup.via}.{lookup.via_column}"
                  for name, lookup in self.lookups.items()]
        parts.append(_DESCRIBE[self.operator])
        if self.local is not None and self.operator is not Operator.KEPT_AGGREGATE:
            parts.append("small batches computed in the process, without Spark")
        return "; ".join(p for p in parts if p)


_DESCRIBE: Final = {
    Operator.RECOMPUTE: "", Operator.WINDOWED: "its windowed input's rows recomputed",
    Operator.KEPT_AGGREGATE: "aggregates kept by their changes",
    Operator.WINDOW_FOLD: "window aggregates folded from the event feed",
    Operator.INTERVAL_JOIN: "an interval join's left events recomputed on their own",
}


# ---------------------------------------------------------------------------------- analysis


@dataclass
class _Scope:
    """The analysis of one plan node: its output columns (by expression id, in order), the
    inputs below it, the equal-key edges of its joins, and a full outer join's key pairs."""

    output: list[int]
    columns: dict[int, Column]
    inputs: set[str]
    #: (input a, column a, input b, column b): a row of a contributes only with a row of b
    #: whose column b equals its column a ("a can be looked up via b").
    edges: set[tuple[str, str, str, str]] = field(default_factory=set)
    full_pairs: set[frozenset[int]] = field(default_factory=set)


class _Analysis:
    def __init__(self, view: str) -> None:
        self.view = view
        self.seen: dict[str, int] = {}

    def refuse(self, what: str, why: str) -> NotMaintainableError:
        return NotMaintainableError(f"view {self.view}: {what}: {why}")

    def check_expression(self, expression: Node, where: str) -> None:
        for node in walk(expression):
            if node.cls in _SUBQUERIES:
                raise self.refuse(f"a subquery in {where}",
                                  "subqueries are not maintained; write them as joins "
                                  "(IN → JOIN, NOT IN / NOT EXISTS → LEFT JOIN ... IS NULL)")
            if node.cls in _NONDETERMINISTIC:
                raise self.refuse(f"{node.cls} in {where}",
                                  "it is not deterministic, so a recomputed partition would "
                                  "differ from the rows it replaces, and a rebuild from the "
                                  "live run")

    def scope(self, node: Node) -> _Scope:
        if node.cls in _REFUSED_NODES and _REFUSED_NODES[node.cls] is not None:
            raise self.refuse(node.cls, str(_REFUSED_NODES[node.cls]))
        for name in ("condition", "projectList", "groupingExpressions",
                     "aggregateExpressions", "order"):
            for expression in expression_trees(node.fields.get(name)):
                self.check_expression(expression, node.cls)
        if node.cls == "View":
            return self.leaf(node)
        if node.cls in _PASS_THROUGH:
            return self.scope(node.children[0])
        if node.cls == "Project":
            return self.project(node, self.scope(node.children[0]),
                                expression_trees(node.fields["projectList"]))
        if node.cls == "Aggregate":
            return self.aggregate(node, self.scope(node.children[0]))
        if node.cls == "Join":
            return self.join(node, self.scope(node.children[0]), self.scope(node.children[1]))
        if node.cls == "Union":
            return self.union([self.scope(child) for child in node.children])
        raise self.refuse(f"the plan step {node.cls}",
                          "lakefold does not know how to maintain it incrementally")

    def leaf(self, node: Node) -> _Scope:
        name = str(node.fields["desc"]["identifier"]["table"])
        self.seen[name] = self.seen.get(name, 0) + 1
        if self.seen[name] > 1:
            raise self.refuse(f"input {name} is read twice (a self-join or a union with "
                              "itself)", "each input is read once per recomputed partition; "
                              "make a second input of the same table or view")
        leaf = node
        while leaf.children:
            leaf = leaf.children[0]
        output, columns = [], {}
        for expression in expression_trees(leaf.fields.get("output")):
            eid = expr_id(expression)
            output.append(eid)
            columns[eid] = Column(expression.fields["name"],
                                  frozenset({(name, expression.fields["name"])}))
        return _Scope(output, columns, {name})

    @staticmethod
    def _derived(expression: Node, below: _Scope) -> Column:
        """The column an expression computes: an attribute keeps what it was; the COALESCE
        of a full outer join's two keys never is NULL for lack of a side; anything else
        equals no input column."""
        name = expression.fields.get("name", "")
        inner = expression.children[0] if expression.cls == "Alias" else expression
        if inner.cls == "AttributeReference":
            return replace(below.columns[expr_id(inner)], name=name)
        if inner.cls == "Coalesce" and all(c.cls == "AttributeReference"
                                           for c in inner.children):
            ids = [expr_id(c) for c in inner.children]
            if any(frozenset(pair) in below.full_pairs
                   for pair in itertools.combinations(ids, 2)):
                sources = frozenset().union(*(below.columns[i].sources for i in ids))
                return Column(name, sources, False)
        return Column(name)

    def project(self, node: Node, below: _Scope, expressions: list[Node]) -> _Scope:
        output, columns = [], {}
        for expression in expressions:
            eid = expr_id(expression)
            output.append(eid)
            columns[eid] = self._derived(expression, below)
        return replace(below, output=output, columns={**below.columns, **columns})

    def aggregate(self, node: Node, below: _Scope) -> _Scope:
        grouping = {expr_id(g) for g in expression_trees(node.fields["groupingExpressions"])
                    if g.cls == "AttributeReference"}
        output, columns = [], {}
        for expression in expression_trees(node.fields["aggregateExpressions"]):
            eid = expr_id(expression)
            output.append(eid)
            inner = expression.children[0] if expression.cls == "Alias" else expression
            keeps = inner.cls == "AttributeReference" and expr_id(inner) in grouping
            columns[eid] = self._derived(expression, below) if keeps else \
                Column(expression.fields.get("name", ""))
        return replace(below, output=output, columns={**below.columns, **columns})

    def join(self, node: Node, left: _Scope, right: _Scope) -> _Scope:
        kind = str(node.fields["joinType"].get("object", "")).rsplit(".", 1)[-1].rstrip("$")
        if kind not in ("Inner", "LeftOuter", "RightOuter", "FullOuter", "LeftSemi",
                        "LeftAnti", "Cross"):
            raise self.refuse(f"a {kind} join", "only inner, outer, semi and anti joins "
                              "on equal keys are maintained")
        columns = {**left.columns, **right.columns}
        pairs: list[tuple[int, int]] = []
        for condition in expression_trees(node.fields.get("condition")):
            for part in conjuncts(condition):
                refs = [_attribute(c) for c in part.children]
                if part.cls in ("EqualTo", "EqualNullSafe") and all(
                        r is not None for r in refs):
                    a, b = (expr_id(r) for r in refs if r is not None)
                    if a in right.columns and b in left.columns:
                        a, b = b, a
                    if a in left.columns and b in right.columns:
                        pairs.append((a, b))
        # Which side's rows contribute only together with a matching row of the other.
        left_needs_right = kind in ("Inner", "RightOuter", "LeftSemi")
        right_needs_left = kind in ("Inner", "LeftOuter", "LeftSemi", "LeftAnti")
        edges = set(left.edges) | set(right.edges)
        for a, b in pairs:
            for (x, cx), (y, cy) in itertools.product(columns[a].sources, columns[b].sources):
                if left_needs_right:
                    edges.add((x, cx, y, cy))
                if right_needs_left:
                    edges.add((y, cy, x, cx))
        if kind in ("LeftOuter", "FullOuter"):
            columns.update({i: replace(c, outer_null=True) for i, c in right.columns.items()})
        if kind in ("RightOuter", "FullOuter"):
            columns.update({i: replace(c, outer_null=True) for i, c in left.columns.items()})
        # An equal key holds the other side's value wherever the other side contributes.
        for a, b in pairs:
            if kind in ("Inner", "LeftOuter", "LeftSemi"):
                columns[a] = replace(columns[a], sources=columns[a].sources
                                     | columns[b].sources)
            if kind in ("Inner", "RightOuter"):
                columns[b] = replace(columns[b], sources=columns[b].sources
                                     | columns[a].sources)
        full = set(left.full_pairs) | set(right.full_pairs)
        if kind == "FullOuter":
            full |= {frozenset(pair) for pair in pairs}
        output = left.output if kind in ("LeftSemi", "LeftAnti") else \
            left.output + right.output
        return _Scope(output, columns, left.inputs | right.inputs, edges, full)

    @staticmethod
    def union(branches: list[_Scope]) -> _Scope:
        first = branches[0]
        columns = dict(first.columns)
        for i, eid in enumerate(first.output):
            merged = [b.columns[b.output[i]] for b in branches]
            columns[eid] = Column(merged[0].name,
                                  frozenset().union(*(c.sources for c in merged)),
                                  any(c.outer_null for c in merged))
        for branch in branches[1:]:
            columns.update({k: v for k, v in branch.columns.items() if k not in columns})
        return _Scope(first.output, columns, set().union(*(b.inputs for b in branches)),
                      set().union(*(b.edges for b in branches)),
                      set().union(*(b.full_pairs for b in branches)))


_INTEGRAL: Final = frozenset({"byte", "short", "integer", "long"})


def _attribute(node: Node) -> Node | None:
    """The column an equality side compares: a column, or a column cast from one integer
    type to another (Spark widens ``int = bigint``; the values, and the text a state looks
    them up by, are the same)."""
    if node.cls == "AttributeReference":
        return node
    if node.cls == "Cast" and len(node.children) == 1 and \
            node.children[0].cls == "AttributeReference" and \
            str(node.fields.get("dataType")) in _INTEGRAL and \
            str(node.children[0].fields.get("dataType")) in _INTEGRAL:
        return node.children[0]
    return None


def _choose(view: str, scope: _Scope, key: tuple[str, ...]) -> ViewPlan | None:
    by_name = {scope.columns[i].name: scope.columns[i] for i in scope.output}
    for size in range(len(key), 0, -1):
        for partition in itertools.combinations(key, size):
            cols = [by_name[p] for p in partition]
            if any(c.outer_null or not c.sources for c in cols):
                continue
            direct: dict[str, tuple[str, ...]] = {}
            for name in sorted(scope.inputs):
                found = [sorted(c for i, c in col.sources if i == name) for col in cols]
                if all(found):
                    direct[name] = tuple(f[0] for f in found)
            if not direct:
                continue
            lookups: dict[str, LookupPath] = {}
            resolved = set(direct)
            progress = True
            while progress and resolved != scope.inputs:
                progress = False
                for x, cx, y, cy in sorted(scope.edges):
                    if x not in resolved and y in resolved:
                        lookups[x] = LookupPath(cx, y, cy)
                        resolved.add(x)
                        progress = True
            if resolved == scope.inputs:
                return ViewPlan({}, key, partition, direct, lookups)
    return None


def analyze_plan(view: str, plan_json: str, key: Sequence[str],
                 inputs: Sequence[str], windowed: str | None = None,
                 input_keys: Mapping[str, Sequence[str]] | None = None,
                 window: WindowColumns | None = None) -> ViewPlan:
    """The maintenance of a view whose analyzed plan is ``plan_json`` (see the module
    docstring); ``inputs`` are the names the view declares; ``windowed``, the input whose
    rows are an event's windows of a fixed size (their ``window_end`` follows from their
    ``window_start``); ``input_keys``, each input's key columns, and ``window``, the
    windowed input's window columns, to refuse a key the plan shows is not unique
    (``_plan_keys``)."""
    analysis = _Analysis(view)
    tree = plan_tree(json.loads(plan_json))
    scope = analysis.scope(tree)
    names = [scope.columns[i].name for i in scope.output]
    unused = [name for name in inputs if name not in scope.inputs]
    if unused:
        which = f"input {unused[0]} is" if len(unused) == 1 else \
            f"inputs {', '.join(unused)} are"
        raise MissingKeyError(f"view {view}: {which} not read by the query; remove it from the "
                              "view's inputs, or read it")
    if not key:
        raise MissingKeyError(f"view {view} needs a key: the output columns that identify a "
                              f"row (its output columns are {', '.join(names)})")
    missing = [k for k in key if k not in names]
    if missing:
        raise MissingKeyError(f"view {view}: key column {', '.join(missing)} is not an "
                              f"output column; the output columns are {', '.join(names)}")
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise MissingKeyError(f"view {view}: the output has two columns named "
                              f"{', '.join(duplicated)}; give them distinct names with AS")
    if input_keys is not None:
        check_key(view, tree, key, scope.output, names, input_keys, window)
    plan = _choose(view, scope, tuple(key))
    if plan is None and not any(scope.columns[i].sources for i in scope.output
                                if scope.columns[i].name in key):
        # No key column is an input's: the view is a few rows computed from all of its
        # inputs (a global aggregate, a histogram of another aggregate); recompute it whole.
        plan = ViewPlan({}, tuple(key), (), {}, {})
    if plan is None:
        raise _unreachable(view, scope, tuple(key))
    plan = replace(plan, local=local_plan(tree))
    return _operator(plan, aggregate_plan(tree), windowed,
                     windowed or (window.input if window is not None else None))


def _operator(plan: ViewPlan, aggregate: AggregatePlan | None, windowed: str | None,
              window_input: str | None) -> ViewPlan:
    """``plan`` with its operator: ``aggregate`` is kept when the view is that one GROUP BY
    over one direct input by its partition, folded when that input is ``windowed`` (an event
    input's fixed windows), and otherwise recomputed (``WINDOWED`` when ``window_input``)."""
    if aggregate is not None and not plan.lookups and list(plan.direct) == [aggregate.input] \
            and set(plan.partition) == {name for name, column in aggregate.groups
                                        if aggregate.input != windowed or column != WINDOW_END}:
        if aggregate.input == windowed:
            return replace(plan, aggregate=aggregate, operator=Operator.WINDOW_FOLD)
        if window_input is None:
            return replace(plan, aggregate=aggregate, operator=Operator.KEPT_AGGREGATE)
    return replace(plan, operator=Operator.RECOMPUTE if window_input is None
                   else Operator.WINDOWED)


def _unreachable(view: str, scope: _Scope, key: tuple[str, ...]) -> NotMaintainableError:
    by_name = {scope.columns[i].name: scope.columns[i] for i in scope.output}
    lines = []
    for k in key:
        column = by_name[k]
        if not column.sources:
            lines.append(f"key column {k} is computed, not taken from an input column")
        elif column.outer_null:
            lines.append(f"key column {k} comes from the optional side of an outer join "
                         "(use COALESCE of both join keys)")
        else:
            lines.append(f"key column {k} equals "
                         f"{', '.join(f'{i}.{c}' for i, c in sorted(column.sources))}")
    joins = sorted({f"{x}.{cx} = {y}.{cy}" for x, cx, y, cy in scope.edges})
    joined = f"are joined on {', '.join(joins)}" if joins else \
        "are not joined on equal keys (a join without equal keys, or a cross join)"
    return NotMaintainableError(
        f"view {view}: no choice of key columns reaches every input ({'; '.join(lines)}; "
        f"inputs {', '.join(sorted(scope.inputs))} {joined}). lakefold recomputes the "
        "partitions a change touches, so each input must either hold a key column or be "
        "joined on equal keys to one that does; split the query into a chain of views, each "
        "grouped or joined on one key")


def view_frame(spark: SparkSession, schemas: Mapping[str, StructType | str],
               query: Query) -> DataFrame:
    """The view's DataFrame over empty inputs (for its plan and output schema): the inputs
    (with a schema each, or its DDL) are temporary views of a session of their own, named as
    the view names them."""
    session = spark.newSession()
    for name, schema in schemas.items():
        session.createDataFrame([], schema).createOrReplaceTempView(name)
    if isinstance(query, str):
        return session.sql(query)
    return query(**{name: session.table(name) for name in schemas})


def arrow_output(frame: DataFrame) -> pa.Schema:
    """The Arrow schema of ``frame``'s rows as ``toArrow`` gives them, read off its analyzed
    plan: no Spark job (``toArrow`` over empty inputs cost a job, ~1 s a view at start)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    large = frame.sparkSession.conf.get("spark.sql.execution.arrow.useLargeVarTypes",
                                        "false") == "true"
    return to_arrow_schema(frame.schema, error_on_duplicated_field_names_in_struct=True,
                           timezone="UTC", prefers_large_types=large)


def analyze(spark: SparkSession, view: str, schemas: Mapping[str, StructType | str],
            query: Query, key: Sequence[str], join: IntervalJoin | None = None,
            windowed: str | None = None,
            input_keys: Mapping[str, Sequence[str]] | None = None,
            window: WindowColumns | None = None) -> ViewPlan:
    """Analyze a view over inputs with ``schemas`` (see ``analyze_plan``), with its
    interval join's bound read off the plan (``operators._interval_join``)."""
    df = view_frame(spark, schemas, query)
    plan = df._jdf.queryExecution().analyzed().toJSON()
    analyzed = analyze_plan(view, plan, key, list(schemas), windowed, input_keys, window)
    if join is not None:
        analyzed = _joined(view, analyzed, bound_join(view, join, plan_tree(json.loads(plan))))
    return replace(analyzed, columns={f.name: f.dataType.simpleString()
                                      for f in df.schema.fields})


def _joined(view: str, plan: ViewPlan, join: IntervalJoin) -> ViewPlan:
    """``plan`` with its interval join, once its partitions are the left events (a left
    event's rows computed on their own, so forgetting one changes no output row)."""
    if dict(plan.direct) != {join.left: ("position",)} or set(plan.lookups) != {join.right}:
        raise MissingKeyError(
            f"view {view}: an interval join's key starts with the left input's position "
            f"(e.g. SELECT {join.left}.position AS {join.left}_position, "
            f"{join.right}.position AS {join.right}_position ... with key=["
            f"'{join.left}_position', '{join.right}_position']), so each left event's rows "
            f"are computed on their own and can be forgotten once its bound passed; this "
            f"key partitions by {', '.join(plan.partition)} ({plan.describe()})")
    return replace(plan, join=join, operator=Operator.INTERVAL_JOIN, aggregate=None)
