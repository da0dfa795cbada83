"""Text values from pgoutput (PostgreSQL's output format) converted to Python values, by kind.

The replication connection runs with ``DateStyle=ISO``, ``IntervalStyle=iso_8601``,
``TimeZone=UTC``, ``extra_float_digits=1`` and ``bytea_output=hex``, so every value arrives in
one known text form. The conversions, per column kind (``_stream_schema.KINDS``):

==============  ============================================================================
int2/4/8        ``int``
numeric         ``decimal.Decimal`` (exact; ``NaN`` and ``±Infinity`` included)
float4/8        ``float`` (``nan``, ``±inf`` included)
text, enum      ``str`` (``bpchar`` keeps its padding, as PostgreSQL outputs it)
bool            ``bool``
date            ``datetime.date``
time            ``datetime.time``
timestamp       naive ``datetime.datetime``
timestamptz     aware ``datetime.datetime`` in UTC
interval        ``Interval(months, days, microseconds)`` (exact, unlike ``timedelta``)
uuid            ``uuid.UUID``
json            ``str``: the exact text (duplicate keys, key order, spacing and numbers as
                written; Debezium's ``io.debezium.data.Json`` does the same)
jsonb           the parsed JSON value, numbers with a fraction or exponent as
                ``decimal.Decimal`` (exact: ``12345678901234567890.123456789`` is not rounded)
bytea           ``bytes``
array           nested ``list`` of the element kind, ``None`` for NULL elements
other           ``str``: the value's text, as PostgreSQL printed it
==============  ============================================================================

Values Python cannot represent (``infinity`` dates and timestamps, years beyond 9999 or BC,
``24:00:00``, infinite intervals) are kept as their text; nothing is ever rounded or clamped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, Final
from uuid import UUID

from lakefold.store._stream_schema import ColumnSchema
from lakefold.store.exceptions import CaptureValueError


@dataclass(frozen=True, slots=True)
class Interval:
    """A PostgreSQL interval, exactly: months, days and microseconds are independent fields
    (a month is not a fixed number of days). Maps 1:1 to Arrow's month_day_nano interval."""

    months: int = 0
    days: int = 0
    microseconds: int = 0

    def to_timedelta(self) -> timedelta:
        """As a timedelta; raises ValueError when the interval has a month part."""
        if self.months:
            raise CaptureValueError(f"{self} has {self.months} months, which have no fixed length")
        return timedelta(days=self.days, microseconds=self.microseconds)


_INTERVAL_ISO: Final = re.compile(
    r"^P(?:(?P<y>-?\d+)Y)?(?:(?P<mo>-?\d+)M)?(?:(?P<w>-?\d+)W)?(?:(?P<d>-?\d+)D)?"
    r"(?:T(?:(?P<h>-?\d+)H)?(?:(?P<mi>-?\d+)M)?(?:(?P<s>-?\d+(?:\.\d+)?)S)?)?$"
)


def parse_interval(text: str) -> Interval | str:
    """An ISO 8601 interval as PostgreSQL prints it with IntervalStyle=iso_8601."""
    match = _INTERVAL_ISO.match(text)
    if match is None:
        return text  # "infinity" (PostgreSQL 17+) or an unexpected style: keep the text
    part = match.groupdict()
    months = int(part["y"] or 0) * 12 + int(part["mo"] or 0)
    days = int(part["w"] or 0) * 7 + int(part["d"] or 0)
    seconds = Decimal(part["s"] or 0)
    micros = int(part["h"] or 0) * 3_600_000_000 + int(part["mi"] or 0) * 60_000_000 \
        + int(seconds * 1_000_000)
    return Interval(months, days, micros)


def parse_array(text: str, delimiter: str = ",") -> list[Any]:
    """A PostgreSQL array literal (``{1,NULL,"a b"}``, nested for more dimensions, optionally
    with a ``[lo:hi]=`` bounds prefix) as nested lists of ``str`` and ``None``."""
    pos = 0
    if text.startswith("["):
        pos = text.index("=") + 1
    value, end = _parse_array_at(text, pos, delimiter)
    if end != len(text):
        raise CaptureValueError(f"trailing characters after array literal: {text!r}")
    return value


def _parse_array_at(text: str, pos: int, delimiter: str) -> tuple[list[Any], int]:
    if text[pos] != "{":
        raise CaptureValueError(f"array literal must start with '{{': {text!r}")
    pos += 1
    items: list[Any] = []
    if text[pos] == "}":
        return items, pos + 1
    while True:
        char = text[pos]
        if char == "{":
            sub, pos = _parse_array_at(text, pos, delimiter)
            items.append(sub)
        elif char == '"':
            pos += 1
            chunk: list[str] = []
            while text[pos] != '"':
                if text[pos] == "\\":
                    pos += 1
                chunk.append(text[pos])
                pos += 1
            items.append("".join(chunk))
            pos += 1
        else:
            start = pos
            while text[pos] != delimiter and text[pos] != "}":
                pos += 1
            token = text[start:pos].strip()
            items.append(None if token.upper() == "NULL" else token)
        if text[pos] == delimiter:
            pos += 1
            continue
        if text[pos] == "}":
            return items, pos + 1
        raise CaptureValueError(f"unexpected {text[pos]!r} in array literal {text!r}")


def _date(text: str) -> date | str:
    try:
        return date.fromisoformat(text)
    except ValueError:
        return text  # infinity, BC, year > 9999


def _time(text: str) -> time | str:
    try:
        return time.fromisoformat(text)
    except ValueError:
        return text  # 24:00:00


def _timestamp(text: str) -> datetime | str:
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return text


def _timestamptz(text: str) -> datetime | str:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return text
    return value.astimezone(UTC) if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _bytea(text: str) -> bytes:
    if text.startswith("\\x"):
        return bytes.fromhex(text[2:])
    return _bytea_escape(text)


def _bytea_escape(text: str) -> bytes:
    """The legacy ``bytea_output=escape`` form (only if a server forces it)."""
    out = bytearray()
    pos = 0
    while pos < len(text):
        char = text[pos]
        if char == "\\":
            if text[pos + 1] == "\\":
                out.append(0x5C)
                pos += 2
            else:
                out.append(int(text[pos + 1:pos + 4], 8))
                pos += 4
        else:
            out += char.encode()
            pos += 1
    return bytes(out)


# pgoutput prints booleans as ``t``/``f``. Snapshots taken before lakefold read them with the
# cast's ``true``/``false``; both forms are read right, and any other text is refused.
BOOL_TEXT: Final[dict[str, bool]] = {"t": True, "f": False, "true": True, "false": False}


def _bool(text: str) -> bool:
    try:
        return BOOL_TEXT[text]
    except KeyError:
        raise CaptureValueError(f"{text!r} is not a boolean's text (t or f)") from None


def _jsonb(text: str) -> Any:
    """jsonb's text parsed; its numbers are PostgreSQL numerics, so none becomes a float."""
    return json.loads(text, parse_float=Decimal)


SCALAR_CONVERTERS: Final[dict[str, Callable[[str], Any]]] = {
    "int2": int,
    "int4": int,
    "int8": int,
    "numeric": Decimal,
    "float4": float,
    "float8": float,
    "text": str,
    "enum": str,
    "other": str,
    "bool": _bool,
    "date": _date,
    "time": _time,
    "timestamp": _timestamp,
    "timestamptz": _timestamptz,
    "interval": parse_interval,
    "uuid": UUID,
    "json": str,
    "jsonb": _jsonb,
    "bytea": _bytea,
}


def _convert_nested(items: list[Any], convert: Callable[[str], Any]) -> list[Any]:
    return [
        None if item is None
        else _convert_nested(item, convert) if isinstance(item, list)
        else convert(item)
        for item in items
    ]


def converter_for(kind: str, element_kind: str | None = None) -> Callable[[str], Any]:
    """The function turning one non-NULL text value of ``kind`` into its Python value."""
    if kind == "array":
        element = SCALAR_CONVERTERS[element_kind or "other"]
        return lambda text: _convert_nested(parse_array(text), element)
    return SCALAR_CONVERTERS[kind]


def convert_value(column: ColumnSchema, text: str | None) -> Any:
    """One text value of ``column`` as its Python value (None stays None)."""
    if text is None:
        return None
    return converter_for(column.kind, column.element_kind)(text)


def convert_row(columns: tuple[ColumnSchema, ...], values: list[str | None] | None,
                *, only_key: bool = False) -> dict[str, Any] | None:
    """A row image as ``{column: value}``; ``only_key`` keeps the key columns only."""
    if values is None:
        return None
    row: dict[str, Any] = {}
    for column, text in zip(columns, values, strict=False):
        if only_key and not column.key:
            continue
        row[column.name] = convert_value(column, text)
    return row
