"""Connection strings: mask passwords before a DSN reaches a log line or an error message."""

from __future__ import annotations

import re

import psycopg.conninfo

_URI_PASSWORD = re.compile(r"^(?P<head>[a-z]+://[^:/@]*:)(?P<password>[^@]*)(?P<tail>@.*)$", re.I)


def mask_dsn(dsn: str) -> str:
    """Return ``dsn`` with any password replaced by ``***``; never raises."""
    match = _URI_PASSWORD.match(dsn)
    if match:
        if not match["password"]:
            return dsn
        return f"{match['head']}***{match['tail']}"
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparseable DSN>"
    if "password" in params:
        params["password"] = "***"  # noqa: S105 - the mask, not a password
    return " ".join(f"{key}={value}" for key, value in params.items())
