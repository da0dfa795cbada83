"""Connection strings: what of a DSN may be shown, checked the way libpq reads it; a driver's
connection error as one line of an error message.

A DSN is never shown as written. It is parsed as libpq parses it (``conninfo_to_dict`` calls
``PQconninfoParse``: the key=value form and ``postgresql://`` URIs alike, whatever a password
holds), and only the fields that say *where* (host, port, database, role) are shown, each only
when it looks like what it names: a URI whose password holds an unencoded ``@`` or ``/`` is
split by libpq elsewhere than its author meant, and pieces of the password then land in the
host or the database name. ``check_dsn`` refuses such a DSN outright, in one line that quotes
none of it.
"""

from __future__ import annotations

import ipaddress
import string
from urllib.parse import urlsplit

from lakefold.core.exceptions import ConfigurationError

#: Fields of a DSN that may be shown (a password only as ``***``).
_SHOWN = ("host", "hostaddr", "port", "dbname", "user")
_HOST_CHARS = frozenset(string.ascii_letters + string.digits + ".-_")
_NAME_FORBIDDEN = frozenset("@:/?#&='\"\\ ")
_UNPARSABLE = "(a DSN that cannot be parsed)"


class DsnError(ConfigurationError):
    """A DSN libpq cannot parse, or one it parses other than its author meant."""


def dsn_fields(dsn: str) -> dict[str, str]:
    """The DSN's fields as libpq reads them; DsnError (quoting nothing of the DSN) when it
    cannot be parsed."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    try:
        fields = conninfo_to_dict(dsn)
    except ProgrammingError as e:
        raise DsnError(_parse_failure(str(e))) from None
    except UnicodeDecodeError:  # a %XX escape that decodes to no UTF-8 text
        raise DsnError("it cannot be parsed (a %XX escape in it is not UTF-8 text); "
                       "percent-encode the whole value (urllib.parse.quote) or write "
                       "key=value pairs") from None
    return {k: str(v) for k, v in fields.items() if v is not None}


def _parse_failure(libpq_message: str) -> str:
    """libpq's reason with the DSN's own text (what it quotes) left out."""
    reason = libpq_message.strip().splitlines()[0] if libpq_message.strip() else "invalid"
    parts = reason.split('"')
    # libpq quotes the offending text between double quotes: keep only what lies outside
    # (and the "=" it says is missing)
    shown = "".join(part if i % 2 == 0 else '"="' if part == "=" else "…"
                    for i, part in enumerate(parts))
    return (f"it cannot be parsed ({shown.strip()}); write key=value pairs (host=db "
            "dbname=app user=app, a value with spaces in single quotes) or a "
            "postgresql://user@host:port/dbname URI")


def _is_host(value: str) -> bool:
    for part in value.split(","):
        if part.startswith("/"):  # a Unix socket directory
            if "@" in part or not part.isprintable() or " " in part:
                return False
            continue
        try:
            ipaddress.ip_address(part.strip("[]"))
            continue
        except ValueError:
            pass
        if not part or not set(part) <= _HOST_CHARS:
            return False
    return True


def _plausible(key: str, value: str) -> bool:
    """Whether ``value`` looks like what field ``key`` names (and so holds no piece of a
    password that libpq split off elsewhere)."""
    if not value or len(value) > 255:
        return False
    if key in ("host", "hostaddr"):
        return _is_host(value)
    if key == "port":
        return all(p.isdigit() for p in value.split(","))
    return value.isprintable() and not (set(value) & _NAME_FORBIDDEN)


def check_dsn(dsn: str, *, what: str = "the DSN") -> dict[str, str]:
    """``dsn``'s fields when libpq parses it as its author meant; otherwise DsnError naming
    ``what`` (e.g. ``LAKEFOLD_DSN``) and the fix, quoting nothing of the DSN."""
    try:
        fields = dsn_fields(dsn)
    except DsnError as e:
        raise DsnError(f"{what} is not a valid PostgreSQL DSN: {e}") from None
    uri = "://" in dsn.split("=", 1)[0]
    for key in _SHOWN:
        value = fields.get(key)
        if value is not None and not _plausible(key, value) and (uri or key == "port"):
            raise DsnError(
                f"{what} is not a valid PostgreSQL DSN: its {key} is not a valid {key}"
                + ("; in a postgresql:// URI, percent-encode @ / ? # : in the password "
                   "(@ as %40, / as %2F, ? as %3F, # as %23, : as %3A) or use the key=value "
                   "form (password='...')" if uri else ""))
    return fields


def mask_dsn(dsn: str) -> str:
    """What may be shown of a DSN: host, port, database and role as libpq reads them (each
    only when it looks like one), ``password=***`` when it has one; never anything else of
    it. A URL of another scheme (``redis://``) shows its scheme, host, port and path."""
    head = dsn.split("=", 1)[0]
    if "://" in head and not head.lower().startswith(("postgresql://", "postgres://")):
        return _mask_url(dsn)
    try:
        fields = dsn_fields(dsn)
    except DsnError:
        return _UNPARSABLE
    shown = [f"{key}={fields[key] if _plausible(key, fields[key]) else '?'}"
             for key in _SHOWN if key in fields]
    if fields.get("password"):
        shown.append("password=***")
    return " ".join(shown) or "(the default server)"


def dsn_address(dsn: str) -> str:
    """Where a DSN points, for a banner: ``host H, port P, database D`` (what it says of
    them, nothing more)."""
    try:
        fields = dsn_fields(dsn)
    except DsnError:
        return _UNPARSABLE
    names = {"host": "host", "port": "port", "dbname": "database"}
    shown = [f"{label} {fields[key] if _plausible(key, fields[key]) else '?'}"
             for key, label in names.items() if key in fields]
    return ", ".join(shown) or "the default server"


def _mask_url(url: str) -> str:
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return f"({url.split(':', 1)[0]} URL that cannot be parsed)"
    host = host if host and _is_host(host) else "?"
    path = parts.path if parts.path and _plausible("dbname", parts.path.strip("/") or "0") \
        else ""
    secret = "***@" if parts.password is not None else ""
    return f"{parts.scheme}://{secret}{host}{port}{path}"


def connection_problem(error: BaseException, dsn: str) -> str:
    """A failed connection's cause on one line (``error_text``) and what to do about it. The
    server is asked whether it runs (libpq's ``PQping``, which does not log in): a server that
    runs and refused the login needs another database, role or password, not a restart."""
    from psycopg import pq

    try:
        ping = pq.Ping(pq.PGconn.ping(dsn.encode("utf-8")))
    except Exception:  # a DSN libpq cannot even read: its own error says why
        ping = pq.Ping.NO_ATTEMPT
    fix = {
        pq.Ping.OK: "the server runs and refused this login: check the DSN's dbname, user "
                    "and password (and the server's pg_hba.conf)",
        pq.Ping.REJECT: "the server runs but accepts no connections now (starting, stopping "
                        "or in recovery); retry in a moment",
    }.get(ping, "check that PostgreSQL is running and reachable at that host and port")
    return f"{error_text(error)}; {fix}"


def error_text(error: BaseException) -> str:
    """A driver error's whole text on one line. libpq puts the cause (``connection to server
    at "db", port 5432 failed: Connection refused``) and a hint (``Is the server running on
    that host ...?``) on lines of their own: both are kept, in that order."""
    return " ".join(str(error).split()) or type(error).__name__
