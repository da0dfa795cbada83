"""Connection strings: mask passwords before a DSN reaches a log line or an error message; a
driver's connection error as one line of an error message."""

from __future__ import annotations

import re

# postgresql://user:password@host...  (the userinfo part of a URI)
_URI_PASSWORD = re.compile(r"^(?P<head>[a-z][a-z0-9+.-]*://[^:/@?]*:)[^@/?]*(?P<tail>@)", re.I)
# password=secret, password = 'se cr\'et', or ?password=secret / &password=secret in a URI
_KEYWORD_PASSWORD = re.compile(r"(?P<key>\bpassword\s*=\s*)(?:'(?:[^'\\]|\\.)*'|[^\s&]*)", re.I)


def mask_dsn(dsn: str) -> str:
    """Return ``dsn`` with every password replaced by ``***``, keeping everything else in place."""
    masked = _URI_PASSWORD.sub(r"\g<head>***\g<tail>", dsn)
    return _KEYWORD_PASSWORD.sub(r"\g<key>***", masked)


def error_text(error: BaseException) -> str:
    """A driver error's whole text on one line. libpq puts the cause (``connection to server
    at "db", port 5432 failed: Connection refused``) and a hint (``Is the server running on
    that host ...?``) on lines of their own: both are kept, in that order."""
    return " ".join(str(error).split()) or type(error).__name__
