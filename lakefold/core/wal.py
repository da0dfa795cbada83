"""The write-ahead log's vocabulary shared by every package: an LSN's text form and the prefix of
the commit markers the event store writes and a capture decodes (``eventstore._commit_markers``)."""

from __future__ import annotations

from typing import Final

from lakefold.core.exceptions import InvalidValueError


def format_lsn(lsn: int) -> str:
    """``0x16B3748`` -> ``'0/16B3748'`` (PostgreSQL's text form of an LSN)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    """``'0/16B3748'`` -> ``0x16B3748``. Raises ``InvalidValueError`` (a
    ``ValueError``) for anything else."""
    high, sep, low = text.strip().partition("/")
    if not sep or not high or not low:
        raise InvalidValueError(f"not an LSN: {text!r} (expected the form 'X/Y', e.g. '0/16B3748')")
    return (int(high, 16) << 32) | int(low, 16)


#: The prefix of a commit marker's logical decoding message.
COMMIT_MARKER_PREFIX: Final = "lakefold.event_commit"
