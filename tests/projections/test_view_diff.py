"""A batch's diff against the view's own rows: with Arrow, column by column, it gives what the
row-by-row diff gives (the oracle: Python dictionaries by key), NULL keys, NULL values and
repeated keys included."""

from __future__ import annotations

from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from lakefold.projections.exceptions import MissingKeyError
from lakefold.projections.operators._view_core import ViewCore

SCHEMA = pa.schema([("city", pa.string()), ("n", pa.int64()), ("amount", pa.decimal128(12, 2)),
                    ("share", pa.float64()), ("ok", pa.bool_())])

_rows = st.lists(st.fixed_dictionaries({
    "city": st.one_of(st.none(), st.sampled_from(["Oslo", "Lima", "Pune", ""])),
    "n": st.one_of(st.none(), st.integers(0, 3)),
    "amount": st.one_of(st.none(), st.decimals(-99, 99, places=2)),
    "share": st.one_of(st.none(), st.sampled_from([0.0, -0.0, 1.5, float("nan")])),
    "ok": st.one_of(st.none(), st.booleans()),
}), max_size=12)


def _core(key: tuple[str, ...]) -> ViewCore:
    core = ViewCore.__new__(ViewCore)
    core.view = "v"
    core.plan = SimpleNamespace(key=key)  # type: ignore[assignment]
    return core


def _unique(rows: list[dict[str, Any]], key: tuple[str, ...]) -> list[dict[str, Any]]:
    return list({tuple(r[k] for k in key): r for r in rows}.values())


def _same(a: pa.Table, b: pa.Table) -> bool:
    def norm(table: pa.Table) -> list[tuple[Any, ...]]:
        return [tuple(("nan",) if isinstance(v, float) and v != v else
                      (str(v) if isinstance(v, Decimal) else v) for v in row.values())
                for row in table.to_pylist()]

    return norm(a) == norm(b)


@settings(max_examples=150, deadline=None)
@given(old=_rows, new=_rows, key=st.sampled_from([("city",), ("city", "n"), ("n", "ok")]))
def test_the_column_diff_equals_the_row_diff(old: list[dict[str, Any]],
                                              new: list[dict[str, Any]],
                                              key: tuple[str, ...]) -> None:
    core = _core(key)
    before = pa.Table.from_pylist(_unique(old, key), schema=SCHEMA)
    after = pa.Table.from_pylist(new, schema=SCHEMA)
    try:
        expected = core._diff_rows(before, after)
    except MissingKeyError:
        with pytest.raises(MissingKeyError, match="two output rows have the key"):
            core._diff_columns(before, after)
        return
    got = core._diff_columns(before, after)
    for mine, theirs in zip(got, expected, strict=True):
        assert _same(mine, theirs)
