"""Aggregates kept by their changes: a view that is one ``GROUP BY`` over one input keeps, per
group, what its aggregates need, and a batch updates it by the before- and after-images of the
input rows it changed, instead of recomputing each touched group from all of its rows.

A group of many rows (a city of 20,000 orders) touched by one changed order costs one row of
work, not 20,000. Which views qualify (``aggregate_plan``): the query's analyzed plan is an
``Aggregate`` directly over one input (no join, filter or expression below it, nothing above
it), grouped by input columns, whose outputs are grouping columns and these aggregates of one
input column each, with no ``FILTER``:

========================  =================================================================
``count(*)``              the group's row count
``count(x)``              the count of its non-NULL ``x``
``sum(x)``                exact (``numeric``) sum, NULL while no ``x`` is non-NULL; ``x``
                          integral or decimal
``avg(x)``                from the sum and count, rounded as Spark rounds it
``min(x)``, ``max(x)``    a multiset of the group's values (value → how many rows hold it),
                          so a deleted minimum gives way to the next; integral, decimal or
                          string ``x`` (strings in byte order, as Spark compares them)
``count(DISTINCT x)``     the number of values in the same kind of multiset
========================  =================================================================

Any other view (and any other type) is recomputed by partitions (``_recompute``), which
is correct for every query; this is the cheaper path for the common one.

The state lives in the store beside the input states (schema ``lakefold_state``), in the
batch's transaction: a group table (the group's key as a JSON array of its texts, its columns'
texts, the row count, per aggregate a non-NULL count and a sum) and one multiset table per
input column that a ``min``, ``max`` or ``count(DISTINCT)`` reads. A batch copies its signed
images (-1 before, +1 after) into a temporary table, folds them into both with one ``INSERT ...
ON CONFLICT`` each, drops emptied values and groups, and reads back the touched groups. A
truncate, and the first batch, rebuild the state from all of the input's rows.
"""

from __future__ import annotations

import hashlib
import io
from decimal import Context, Decimal
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
from psycopg import sql

from lakefold.projections.plan._aggregate_plan import AggregatePlan, Measure, _decimal
from lakefold.projections.state._stream_state import STATE_SCHEMA, LatestRows, StateChanges
from lakefold.store.internals import ColumnSchema, typed_array

#: The column of the group key (text, never NULL) that ``_touched`` adds to the rows.
GROUP_KEY = "_gkey"
#: The temporary table of a batch's signed images (dropped at commit).
DELTA_TABLE = "lf_agg_delta"
_EXACT = Context(prec=100)


def spark_average(total: Decimal, count: int, precision: int, scale: int) -> Decimal:
    """``avg`` of a ``decimal(precision, scale)`` column as Spark computes it from the sum and
    the count: the sum (``decimal(p + 10, s)``) divided by the count (``decimal(20, 0)``) at the
    scale Spark's decimal division without precision loss gives, half up, then cast to
    ``decimal(p + 4, s + 4)``, half up again. Exact integer arithmetic throughout."""
    p1, s1 = min(38, precision + 10), scale
    whole, division_scale = min(38, p1 - s1), min(38, max(6, s1 + 20 + 1))
    excess = whole + division_scale - 38
    if excess > 0:
        division_scale -= excess // 2 + 1
    quotient = _divide(_scaled(total, division_scale), count)
    result_scale = min(38, scale + 4)
    if division_scale >= result_scale:
        digits = _divide(quotient, 10 ** (division_scale - result_scale))
    else:
        digits = quotient * 10 ** (result_scale - division_scale)
    return Decimal(digits).scaleb(-result_scale, context=_EXACT)


def _scaled(value: Decimal, scale: int) -> int:
    """``value * 10**scale`` as an exact integer (``value`` has at most ``scale`` decimals)."""
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int) and exponent + scale >= 0  # noqa: S101 - a decimal sum
    magnitude: int = int("".join(map(str, digits)) or "0") * 10 ** (exponent + scale)
    return -magnitude if sign else magnitude


def _divide(numerator: int, denominator: int) -> int:
    """``numerator / denominator`` rounded half up (away from zero), as Spark rounds."""
    q, r = divmod(abs(numerator), denominator)
    if 2 * r >= denominator:
        q += 1
    return q if numerator >= 0 else -q


class AggregateState:
    """The state of one view generation kept by its changes (see the module docstring)."""

    def __init__(self, owner: str, plan: AggregatePlan, state: LatestRows | None) -> None:
        self.plan = plan
        self.state = state
        digest = hashlib.sha1(owner.encode(), usedforsecurity=False).hexdigest()[:16]
        #: The state's table names start with it (in ``lakefold_state``).
        self.name = f"agg_{digest}"
        self.groups = sql.Identifier(STATE_SCHEMA, self.name)
        self.values = {column: sql.Identifier(STATE_SCHEMA, f"{self.name}_v{i}")
                       for i, column in enumerate(plan.multisets)}
        self._kinds = {m.column: m.kind for m in plan.measures if m.column is not None}

    def _value_type(self, column: str) -> sql.Composable:
        kind = self._kinds[column]
        return sql.SQL("text COLLATE \"C\"" if kind == "string" else "numeric")

    def _cast(self, column: str, expression: sql.Composable) -> sql.Composable:
        return sql.SQL("({})::{}").format(expression, self._value_type(column))

    def create(self, conn: psycopg.Connection[Any]) -> None:
        """Create the state's tables (idempotent)."""
        groups = [sql.SQL("g{} text").format(sql.SQL(str(i)))
                  for i in range(len(self.plan.groups))]
        measures = [sql.SQL("c{i} bigint NOT NULL DEFAULT 0, s{i} numeric NOT NULL DEFAULT 0")
                    .format(i=sql.SQL(str(i))) for i in range(len(self.plan.columns))]
        conn.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (gkey text PRIMARY KEY, {}, rows bigint NOT NULL, "
            "{})").format(self.groups, sql.SQL(", ").join(groups),
                          sql.SQL(", ").join(measures) if measures else sql.SQL("x int")))
        for column, table in self.values.items():
            conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (gkey text NOT NULL, value {} NOT NULL, "
                "n bigint NOT NULL, PRIMARY KEY (gkey, value))")
                .format(table, self._value_type(column)))

    def drop(self, conn: psycopg.Connection[Any]) -> None:
        for table in (self.groups, *self.values.values()):
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))

    # ------------------------------------------------------------------ one batch

    def apply(self, conn: psycopg.Connection[Any], change: StateChanges | None,
              output: pa.Schema) -> pa.Table:
        """Fold a batch's images into the state (``change`` None: rebuild it from all of the
        input's rows) and return the rows of the groups it touched (all groups on a rebuild),
        typed as ``output``."""
        assert self.state is not None  # noqa: S101 - kept from an input's state
        if change is None:
            for table in (self.groups, *self.values.values()):
                conn.execute(sql.SQL("TRUNCATE {}").format(table))
            signed = [(1, self.state.rows(conn))]
        else:
            signed = [(-1, change.before), (1, change.after)]
        self._load(conn, signed)
        self._fold(conn)
        return self._touched(conn, output, everything=change is None).drop_columns([GROUP_KEY])

    @property
    def texts(self) -> list[str]:
        """The delta's text columns: ``g<i>`` per grouping column, ``x<i>`` per input column
        an aggregate reads."""
        return [f"g{i}" for i in range(len(self.plan.groups))] + \
            [f"x{i}" for i in range(len(self.plan.columns))]

    def _create_delta(self, conn: psycopg.Connection[Any], *extra: str) -> None:
        """The temporary delta table of signed images (dropped at commit), with ``extra``
        text columns after ``sign``."""
        conn.execute(sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} (sign int NOT NULL, {}) "
                             "ON COMMIT DROP").format(
            sql.Identifier(DELTA_TABLE),
            sql.SQL(", ").join(sql.SQL("{} text").format(sql.Identifier(n))
                               for n in (*extra, *self.texts))))

    def _load(self, conn: psycopg.Connection[Any], signed: list[tuple[int, pa.Table]]) -> None:
        """The signed images into the temporary delta table (one CSV ``COPY``)."""
        assert self.state is not None  # noqa: S101 - kept from an input's state
        columns = [c for _, c in self.plan.groups] + list(self.plan.columns)
        names = ["sign", *self.texts]
        self._create_delta(conn)
        parts = []
        for sign, raw in signed:
            if raw.num_rows == 0:
                continue
            arrays = [pa.array(np.full(raw.num_rows, sign, dtype=np.int32))]
            arrays += [self.state.raw_array(conn, raw, c) for c in columns]
            parts.append(pa.Table.from_arrays(arrays, names=names))
        if parts:
            copy_csv(conn, pa.concat_tables(parts), sql.Identifier(DELTA_TABLE))

    def _gkey(self, prefix: str = "") -> sql.Composable:
        return sql.SQL("json_build_array({})::text").format(sql.SQL(", ").join(
            sql.SQL(prefix + "g{}").format(sql.SQL(str(i)))
            for i in range(len(self.plan.groups))))

    def _fold(self, conn: psycopg.Connection[Any], *, retracting: bool = True) -> None:
        """Fold the delta into the state; ``retracting``: it holds rows of sign -1 (values
        and groups may empty; with only +1 rows none can)."""
        delta = sql.Identifier(DELTA_TABLE)
        gs = [sql.SQL("g{}").format(sql.SQL(str(i))) for i in range(len(self.plan.groups))]
        names, picks, updates = [], [], []
        for i, column in enumerate(self.plan.columns):
            x = sql.SQL("x{}").format(sql.SQL(str(i)))
            c, s = sql.SQL("c{}").format(sql.SQL(str(i))), sql.SQL("s{}").format(sql.SQL(str(i)))
            names += [c, s]
            summable = self._kinds[column] != "string"
            picks += [sql.SQL("coalesce(sum(sign) FILTER (WHERE {x} IS NOT NULL), 0)")
                      .format(x=x),
                      sql.SQL("coalesce(sum(sign * ({x})::numeric), 0)").format(x=x)
                      if summable else sql.SQL("0")]
            updates += [sql.SQL("{c} = t.{c} + excluded.{c}").format(c=c),
                        sql.SQL("{s} = t.{s} + excluded.{s}").format(s=s)]
        conn.execute(sql.SQL(
            "INSERT INTO {groups} AS t (gkey, {gs}, rows{names}) SELECT {gkey}, {gs}, sum(sign)"
            "{picks} FROM {delta} GROUP BY {gs} ON CONFLICT (gkey) DO UPDATE SET "
            "rows = t.rows + excluded.rows{updates}").format(
                groups=self.groups, gs=sql.SQL(", ").join(gs), gkey=self._gkey(),
                names=sql.SQL("").join(sql.SQL(", ") + n for n in names),
                picks=sql.SQL("").join(sql.SQL(", ") + p for p in picks), delta=delta,
                updates=sql.SQL("").join(sql.SQL(", ") + u for u in updates)))
        for column, table in self.values.items():
            x = sql.SQL("x{}").format(sql.SQL(str(self.plan.columns.index(column))))
            conn.execute(sql.SQL(
                "INSERT INTO {table} AS t (gkey, value, n) SELECT {gkey}, {value}, sum(sign) "
                "FROM {delta} WHERE {x} IS NOT NULL GROUP BY 1, 2 ON CONFLICT (gkey, value) "
                "DO UPDATE SET n = t.n + excluded.n").format(
                    table=table, gkey=self._gkey(), value=self._cast(column, x), delta=delta,
                    x=x))
            if not retracting:
                continue
            conn.execute(sql.SQL(
                "DELETE FROM {table} v USING (SELECT DISTINCT {gkey} AS gkey FROM {delta}) d "
                "WHERE v.gkey = d.gkey AND v.n = 0").format(table=table, gkey=self._gkey(),
                                                              delta=delta))
        if not retracting:
            return
        conn.execute(sql.SQL(
            "DELETE FROM {groups} g USING (SELECT DISTINCT {gkey} AS gkey FROM {delta}) d "
            "WHERE g.gkey = d.gkey AND g.rows = 0").format(
                groups=self.groups, gkey=self._gkey(), delta=delta))

    def _touched(self, conn: psycopg.Connection[Any], output: pa.Schema, *,
                 everything: bool, also: sql.Composable | None = None,
                 keep_delta: bool = False) -> pa.Table:
        """The output rows of the groups in the delta (all groups: ``everything``), and
        those matching the condition ``also`` on the group table ``g``, each with its group
        key (column ``GROUP_KEY``); the delta is dropped unless ``keep_delta``."""
        selects: list[sql.Composable] = [sql.SQL("g.g{}").format(sql.SQL(str(i)))
                                         for i in range(len(self.plan.groups))]
        selects.append(sql.SQL("g.rows"))
        for i in range(len(self.plan.columns)):
            selects += [sql.SQL("g.c{}").format(sql.SQL(str(i))),
                        sql.SQL("g.s{}::text").format(sql.SQL(str(i)))]
        for table in self.values.values():
            selects += [sql.SQL("(SELECT min(value)::text FROM {} v WHERE v.gkey = g.gkey)")
                        .format(table),
                        sql.SQL("(SELECT max(value)::text FROM {} v WHERE v.gkey = g.gkey)")
                        .format(table),
                        sql.SQL("(SELECT count(*) FROM {} v WHERE v.gkey = g.gkey)")
                        .format(table)]
        selects.append(sql.SQL("g.gkey"))
        query = sql.SQL("SELECT {} FROM {} g").format(sql.SQL(", ").join(selects), self.groups)
        if not everything:  # each part by its index (an OR would scan every group)
            query = sql.SQL("{q} WHERE g.gkey IN (SELECT {gkey} FROM {delta}){also}").format(
                q=query, gkey=self._gkey(), delta=sql.Identifier(DELTA_TABLE),
                also=sql.SQL("") if also is None else
                sql.SQL(" UNION {} WHERE {}").format(query, also))
        rows = conn.execute(query).fetchall()
        if not keep_delta:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(DELTA_TABLE)))
        return self._rows(conn, rows, output).append_column(
            GROUP_KEY, pa.array([r[-1] for r in rows], pa.string()))

    def _rows(self, conn: psycopg.Connection[Any], rows: list[tuple[Any, ...]],
              output: pa.Schema) -> pa.Table:
        n_groups, n_columns = len(self.plan.groups), len(self.plan.columns)
        by_name = self._columns(conn)
        arrays: dict[str, pa.Array] = {}
        for i, (name, column) in enumerate(self.plan.groups):
            texts = pa.array([r[i] for r in rows], pa.string())
            arrays[name] = typed_array(by_name[column], texts).cast(output.field(name).type)
        stats = {column: (n_groups + 1 + 2 * j, n_groups + 2 + 2 * j)
                 for j, column in enumerate(self.plan.columns)}
        first_set = n_groups + 1 + 2 * n_columns
        sets = {column: first_set + 3 * j for j, column in enumerate(self.values)}
        for measure in self.plan.measures:
            field = output.field(measure.name)
            if measure.function == "rows":
                values: list[Any] = [int(r[n_groups]) for r in rows]
            elif measure.function == "count":
                values = [int(r[stats[str(measure.column)][0]]) for r in rows]
            elif measure.function == "distinct":
                values = [int(r[sets[str(measure.column)] + 2]) for r in rows]
            elif measure.function in ("min", "max"):
                at = sets[str(measure.column)] + (0 if measure.function == "min" else 1)
                texts = pa.array([r[at] for r in rows], pa.string())
                arrays[measure.name] = typed_array(by_name[str(measure.column)], texts) \
                    .cast(field.type)
                continue
            else:
                count_at, sum_at = stats[str(measure.column)]
                values = [self._sum_or_average(measure, int(r[count_at]), r[sum_at])
                          for r in rows]
            arrays[measure.name] = pa.array(values, field.type)
        return pa.table([arrays[f.name] for f in output], schema=output)

    def _columns(self, conn: psycopg.Connection[Any]) -> dict[str, ColumnSchema]:
        """The input's columns (to type the texts the state keeps), by name."""
        assert self.state is not None  # noqa: S101 - kept from an input's state
        meta = self.state.meta(conn)
        assert meta.latest is not None  # noqa: S101 - a state with rows has a schema
        return {c.name: c for c in meta.latest.columns}

    @staticmethod
    def _sum_or_average(measure: Measure, count: int, total: str) -> Any:
        if count == 0:
            return None
        exact = Decimal(total)
        decimal = _decimal(measure.kind)
        if measure.function == "sum":
            return exact if decimal is not None else int(exact)
        if decimal is None:  # avg of integers: a double, the sum is exact below 2**53
            return float(int(exact)) / count
        return spark_average(exact, count, *decimal)


def copy_csv(conn: psycopg.Connection[Any], table: pa.Table, target: sql.Composable) -> None:
    """``table``'s rows into ``target`` with one CSV ``COPY`` (a NULL is an unquoted empty
    field, every value is quoted)."""
    buffer = io.BytesIO()
    pacsv.write_csv(table, buffer,
                    pacsv.WriteOptions(include_header=False, quoting_style="all_valid"))
    with conn.cursor() as cur, cur.copy(sql.SQL("COPY {} FROM STDIN (FORMAT csv)")
                                        .format(target)) as copy:
        copy.write(buffer.getvalue())
