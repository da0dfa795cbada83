"""What the source itself says a row's values are: psycopg loads them from the source table,
with loaders that keep exactly what lakefold's typed reads promise
(``lakefold.store._text_values``), but computed independently of lakefold's own parsers.

- values Python cannot represent (infinite, BC or year > 9999 dates and timestamps, 24:00)
  load as the server's text, as lakefold keeps them;
- ``json`` loads as its exact text, ``jsonb`` as parsed JSON with exact (Decimal) numbers;
- intervals load as ``Interval(months, days, microseconds)`` from PostgreSQL's ``postgres``
  interval style (lakefold parses the ISO 8601 style);
- types lakefold keeps as text (``other``: inet, cidr, money, timetz, bit, oid ..., and
  arrays of them) load as the server's output text.

``same`` compares two typed values exactly: same Python types, Decimals by their text (scale
included), floats NaN-aware and signed zeros told apart, recursively through lists and dicts.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from functools import partial
from typing import Any

import psycopg
from psycopg import sql
from psycopg.adapt import Loader
from psycopg.types.datetime import DateLoader, TimeLoader, TimestampLoader, TimestamptzLoader
from psycopg.types.json import set_json_loads
from psycopg.types.string import TextLoader

from lakefold.capture import Interval

ORACLE_SESSION = ("SET datestyle = 'ISO, YMD'; SET intervalstyle = postgres; "
                  "SET timezone = 'UTC'; SET extra_float_digits = 1; SET bytea_output = hex")

_TEXT_TYPES = ("json", "inet", "cidr", "money", "macaddr", "timetz", "bit", "varbit", "oid",
               "xml")

_INTERVAL = re.compile(
    r"(?:(?P<y>-?\d+) years? ?)?(?:(?P<mo>-?\d+) mons? ?)?(?:(?P<d>-?\d+) days? ?)?"
    r"(?:(?P<sign>[+-])?(?P<h>\d+):(?P<mi>\d\d):(?P<s>\d\d)(?:\.(?P<f>\d{1,6}))?)?")


def _text_on_overflow(base: type[Loader]) -> type[Loader]:
    class Fallback(base):  # type: ignore[valid-type,misc]
        def load(self, data: Any) -> Any:
            try:
                return super().load(data)
            except psycopg.DataError:
                return bytes(data).decode()
    return Fallback


class _IntervalLoader(Loader):
    """``postgres`` interval style (``1 year 2 mons -3 days -04:05:06.5``) as ``Interval``."""

    def load(self, data: Any) -> Any:
        text = bytes(data).decode()
        if text in ("infinity", "-infinity"):
            return text
        match = _INTERVAL.fullmatch(text)
        assert match is not None and text, f"unexpected interval text {text!r}"
        part = match.groupdict()
        micros = 0
        if part["h"] is not None:
            micros = ((int(part["h"]) * 60 + int(part["mi"])) * 60 + int(part["s"])) * 10**6 \
                + int((part["f"] or "").ljust(6, "0"))
            micros = -micros if part["sign"] == "-" else micros
        return Interval(int(part["y"] or 0) * 12 + int(part["mo"] or 0), int(part["d"] or 0),
                        micros)


def oracle_connection(dsn: str) -> psycopg.Connection[Any]:
    """A connection to the source whose loaders give the values described above."""
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(ORACLE_SESSION)
    set_json_loads(partial(json.loads, parse_float=Decimal), conn)
    for name in _TEXT_TYPES:
        conn.adapters.register_loader(name, TextLoader)
        info = conn.adapters.types.get(name)
        if name != "json" and info is not None:  # arrays of the others stay text too
            conn.adapters.register_loader(info.array_oid, TextLoader)
    for name, base in (("date", DateLoader), ("time", TimeLoader),
                       ("timestamp", TimestampLoader), ("timestamptz", TimestamptzLoader)):
        conn.adapters.register_loader(name, _text_on_overflow(base))
    conn.adapters.register_loader("interval", _IntervalLoader)
    return conn


def source_values(dsn: str, table: str, columns: dict[str, str | None],
                  key: str = "id") -> dict[Any, dict[str, Any]]:
    """``{key: {column: value}}`` of every row; ``columns`` maps each column to a type to cast
    it to first (user array types psycopg does not know: an enum array to ``text[]``, a
    domain array to its base type's array), or None."""
    select = sql.SQL(", ").join(
        sql.SQL("{c}::{t} AS {c}").format(c=sql.Identifier(name), t=sql.SQL(cast))
        if cast else sql.Identifier(name) for name, cast in columns.items())
    with oracle_connection(dsn) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        cur.execute(sql.SQL("SELECT {} FROM {}").format(select, sql.Identifier(table)))
        return {row[key]: row for row in cur.fetchall()}


def same(a: Any, b: Any) -> bool:
    """Exactly the same typed value (see the module docstring)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, Decimal):
        return str(a) == str(b)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def differences(expected: dict[str, Any], actual: dict[str, Any]) -> dict[str, Any]:
    """The columns whose values are not ``same``: ``{column: (expected, actual)}``."""
    return {name: (expected.get(name), actual.get(name))
            for name in expected.keys() | actual.keys()
            if not same(expected.get(name), actual.get(name))}
