"""The change event: one row-level change of a captured table, as read from a changelog stream.

This is the public value type for individual events (``ChangelogStore.read_events``). Bulk
readers get the same information as Arrow tables instead; the capture's hot path never builds
these models.

Values in ``key``, ``before`` and ``after`` are typed per column (see
``lakefold.store._text_values``): ``int``, ``Decimal``, ``float``, ``str``, ``bool``,
``date``, ``time``, ``datetime``, ``Interval``, ``UUID``, ``bytes``, lists for arrays; a ``json``
value is its exact text (``str``), a ``jsonb`` value parsed JSON with exact numbers
(``Decimal``).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from lakefold.core.wal import format_lsn
from lakefold.schemas.exceptions import SchemaValueError


class Operation(StrEnum):
    """What happened to the row. ``read`` is a row copied by a snapshot, not a change."""

    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"
    TRUNCATE = "truncate"
    READ = "read"

    @property
    def code(self) -> str:
        """The one-letter code stored in the changelog (``i``, ``u``, ``d``, ``t``, ``r``)."""
        return _CODES[self]

    @classmethod
    def from_code(cls, code: str) -> Operation:
        """The operation for a stored one-letter code; raises ValueError for anything else."""
        try:
            return _BY_CODE[code]
        except KeyError:
            raise SchemaValueError(f"unknown operation code {code!r}; expected one of "
                             f"{', '.join(sorted(_BY_CODE))}") from None


_CODES = {
    Operation.INSERT: "i", Operation.UPDATE: "u", Operation.DELETE: "d",
    Operation.TRUNCATE: "t", Operation.READ: "r",
}
_BY_CODE = {code: op for op, code in _CODES.items()}


class ChangeSource(BaseModel):
    """Where the change happened: the source database, schema and table."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, serialize_by_alias=True)

    database: str
    schema_name: str = Field(alias="schema")
    table: str


class ChangeEvent(BaseModel):
    """One change of one row (or a truncate of the table), with its position in the source.

    ``(commit_lsn, ordinal)`` identifies the change uniquely in the source's history: the LSN
    of the commit record of its transaction and its 1-based index among the transaction's
    changes. ``key`` holds the primary key columns; ``before`` is present when the replica
    identity provides an old row image (``REPLICA IDENTITY FULL``, or the old key when a key
    changed); ``after`` is absent for deletes and truncates. ``position`` is the record's
    position in its changelog stream, when the event was read from one.
    """

    model_config = ConfigDict(frozen=True, ser_json_bytes="base64", val_json_bytes="base64")

    source: ChangeSource
    operation: Operation
    key: dict[str, Any] | None = None
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    commit_lsn: int = Field(ge=0)
    ordinal: int = Field(ge=1)
    xid: int = Field(ge=0)
    commit_ts: datetime
    schema_version: int = Field(ge=1)
    position: int | None = Field(default=None, ge=1)

    @property
    def commit_lsn_text(self) -> str:
        """The commit LSN in PostgreSQL's ``X/Y`` form."""
        return format_lsn(self.commit_lsn)

    @property
    def dedupe_key(self) -> tuple[int, int]:
        """``(commit_lsn, ordinal)``: equal for the same change, however often it is read."""
        return (self.commit_lsn, self.ordinal)
