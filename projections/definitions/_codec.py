"""JSON that round-trips the values projections hold: decimals, timestamps, dates, bytes.

Fold state lives in Spark's state store as text, and dead letters keep the failed record as
``jsonb``; both must come back with the same Python types, so values JSON cannot represent are
tagged (``{"$decimal": "12.30"}``) instead of being rounded to floats or turned into strings.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import uuid
from decimal import Decimal
from typing import Any

from lakefold.projections.exceptions import ProjectionTypeError, TargetError

_TAGS = ("$decimal", "$datetime", "$date", "$time", "$bytes", "$uuid")


def _default(value: object) -> object:
    if isinstance(value, Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, dt.datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, dt.date):
        return {"$date": value.isoformat()}
    if isinstance(value, dt.time):
        return {"$time": value.isoformat()}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, uuid.UUID):
        return {"$uuid": str(value)}
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item):
        return item()
    to_pydatetime = getattr(value, "to_pydatetime", None)  # pandas Timestamp
    if callable(to_pydatetime):
        return _default(to_pydatetime())
    model_dump = getattr(value, "model_dump", None)  # pydantic models
    if callable(model_dump):
        return model_dump()
    raise ProjectionTypeError(f"cannot store a {type(value).__name__} in projection state or "
                              "dead letters; use JSON-like values, dataclasses or pydantic models")


def _hook(obj: dict[str, Any]) -> object:
    if len(obj) == 1:
        ((tag, text),) = obj.items()
        if tag in _TAGS and isinstance(text, str):
            if tag == "$decimal":
                return Decimal(text)
            if tag == "$datetime":
                return dt.datetime.fromisoformat(text)
            if tag == "$date":
                return dt.date.fromisoformat(text)
            if tag == "$time":
                return dt.time.fromisoformat(text)
            if tag == "$bytes":
                return base64.b64decode(text)
            return uuid.UUID(text)
    return obj


def dumps(value: object) -> str:
    """Encode ``value`` as tagged JSON (TypeError for values that cannot be stored)."""
    return json.dumps(value, default=_default, separators=(",", ":"), allow_nan=False)


def loads(text: str) -> Any:
    """Decode tagged JSON back to the original Python values."""
    return json.loads(text, object_hook=_hook)


def plain(value: object) -> Any:
    """``value`` as plain JSON-able data (tagged where needed), for ``jsonb`` columns."""
    return json.loads(dumps(value))


def _scalar(value: object) -> str:
    """A hash field value: text for scalars, JSON for nested values."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | Decimal):
        return str(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="backslashreplace")
    return json.dumps(value, default=_json_default, sort_keys=True)


def key_text(value: object, *, nulls: bool = False) -> str:
    """The text form of a key value, as used in Redis keys and search document ids; a NULL
    key is ``NULL_KEY`` with ``nulls`` (a view's target, and readers), else an error."""
    if value is None:
        if nulls:
            return NULL_KEY
        raise TargetError("a row has a null key; the key column must never be null")
    return _scalar(value)


def _json_default(value: object) -> object:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="backslashreplace")
    raise ProjectionTypeError(f"cannot encode {type(value).__name__} as JSON")


#: The text of a NULL key where a target takes them (a view's group of NULLs, as SQL has it):
#: PostgreSQL text never holds a NUL character, so no text key reads the same.
NULL_KEY = "\x00"
