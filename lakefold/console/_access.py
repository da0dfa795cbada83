"""Who may use the console: the listening address, the names it answers to, and the token.

The console listens on 127.0.0.1 unless told otherwise; any other address needs a token, and
is refused without one, or with a weak one (fewer than ``MIN_TOKEN_LENGTH`` characters or
fewer than ``MIN_TOKEN_DISTINCT`` different ones). The token comes from a file
(``--token-file``, ``LAKEFOLD_CONSOLE_TOKEN_FILE``), the environment
(``LAKEFOLD_CONSOLE_TOKEN``) or ``--token`` (which other users of the machine see in ``ps``:
the command warns). It is compared in constant time, as UTF-8 bytes, and never written to a
page or a log.

A browser is not bounded by loopback: any page it opens can send requests to 127.0.0.1, and a
name the attacker controls can resolve to it (DNS rebinding). So the console answers only
requests whose ``Host`` is one of its own names (``allowed_hosts``: ``localhost``, an IP
address, the address it listens on, its machine's name when it listens beyond loopback, and the
names given with ``--allow-host``); the rest of the checks are in ``_guard``.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import stat
from pathlib import Path

from lakefold.console.exceptions import ConsoleBindError

log = logging.getLogger("lakefold.console")

#: The shortest token accepted on a non-loopback address, and how many different characters
#: it needs at least (``secrets.token_urlsafe(24)`` gives 32 characters, ~24 different).
MIN_TOKEN_LENGTH = 16
MIN_TOKEN_DISTINCT = 8
_MAKE_ONE = "python3 -c 'import secrets; print(secrets.token_urlsafe(24))' > token"


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_token(token: str) -> None:
    """Refuse a token that cannot travel or be typed as given: blank, with whitespace around
    it, or with control characters (ConsoleBindError, with the fix)."""
    if not token.strip():
        raise ConsoleBindError(f"the console token is blank; make one: {_MAKE_ONE}")
    if token != token.strip() or not token.isprintable():
        raise ConsoleBindError(
            "the console token has whitespace around it or control characters in it; use "
            f"printable characters only, e.g. {_MAKE_ONE}")


def check_bind(host: str, token: str | None) -> None:
    """Refuse a non-loopback address without a token, or with a weak one, and any malformed
    token (ConsoleBindError, with the fix)."""
    if token is not None and token != "":
        check_token(token)
    if is_loopback(host):
        return
    if not token:
        raise ConsoleBindError(
            f"refusing to listen on {host} without a token: anyone who reaches it could pause "
            "projections and read data; give one with --token-file FILE (or set "
            "LAKEFOLD_CONSOLE_TOKEN), or listen on 127.0.0.1")
    if len(token) < MIN_TOKEN_LENGTH or len(set(token)) < MIN_TOKEN_DISTINCT:
        raise ConsoleBindError(
            f"refusing to listen on {host} with a weak token: a token that anyone on the "
            f"network may try needs at least {MIN_TOKEN_LENGTH} characters, "
            f"{MIN_TOKEN_DISTINCT} of them different; make one: {_MAKE_ONE}")


def read_token_file(path: Path) -> str:
    """The token in ``path`` (its one line, without the line end); warns when other users
    may read the file. ConsoleBindError when it cannot be read or is empty."""
    try:
        text = path.read_text(encoding="utf-8")
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as e:
        raise ConsoleBindError(f"cannot read the console token from {path}: "
                               f"{getattr(e, 'strerror', None) or e}") from None
    token = text.removesuffix("\n").removesuffix("\r")
    if not token:
        raise ConsoleBindError(f"the console token file {path} is empty; make one: {_MAKE_ONE}")
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        log.warning("the console token file %s may be read by other users; chmod 600 it", path)
    return token


def allowed_hosts(host: str, extra: tuple[str, ...] = ()) -> frozenset[str]:
    """The ``Host`` names the console answers to besides IP addresses (always accepted: a
    rebinding page has a name, not an address): ``localhost``, the listening address, the
    ``extra`` names, and the machine's name when listening beyond loopback."""
    names = {"localhost", host.strip("[]").lower(), *(n.lower().rstrip(".") for n in extra)}
    if not is_loopback(host):
        names.add(socket.gethostname().lower())
    return frozenset(n for n in names if n)


def host_allowed(header: str, allowed: frozenset[str]) -> bool:
    """Whether a request's ``Host`` header (``name[:port]``, ``[v6][:port]``) names the
    console: an IP address, or one of ``allowed``."""
    name = split_host(header)[0]
    if not name:
        return False
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return name in allowed


def split_host(header: str) -> tuple[str, int | None]:
    """``(name, port)`` of a ``Host`` value, the name lower-cased without a final dot; an
    empty name when the value is not a host."""
    value = header.strip().lower()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            return "", None
    else:
        name, _, port_text = value.partition(":")
    if port_text and not port_text.isdigit():
        return "", None
    if any(c in name for c in "/@?#\\ ") or not name.isprintable():
        return "", None
    return name.rstrip("."), int(port_text) if port_text else None


def token_from(option: str | None, file: Path | None, setting: str | None) -> str | None:
    """The token, from ``--token-file`` first, then ``--token`` (with a warning: other users
    see it in ``ps``), then the setting (``LAKEFOLD_CONSOLE_TOKEN``); None when none is
    given."""
    if file is not None:
        return read_token_file(file)
    if option:
        log.warning("--token is visible to every user of this machine (ps, /proc); prefer "
                    "--token-file FILE or LAKEFOLD_CONSOLE_TOKEN")
        return option
    return setting or None
