"""The captures a store records, each with its source and streams: what ``lakefold capture
streams``, ``lakefold status`` and the console list, read from the store alone (a capture's
source may be a server the reader cannot reach; see ``capture.operations._sources``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from lakefold.store import _ddl

# source and stream_prefix through to_jsonb: a store not yet migrated to them answers too
_CAPTURES = """
SELECT c.slot_name, coalesce(to_jsonb(c) ->> 'source', ''), c.source_database,
       c.source_system_id, to_jsonb(c) ->> 'stream_prefix', c.publication, c.records,
       c.flush_lsn, c.last_commit_ts,
       coalesce((SELECT array_agg(s.name ORDER BY s.name) FROM lakefold.changelog_streams s
                 WHERE s.slot_name = c.slot_name), '{}')
FROM lakefold.capture_slots c ORDER BY c.slot_name
"""


@dataclass(frozen=True, slots=True)
class CaptureInfo:
    """One capture the store records: its slot, its source (``host:port/database`` as the
    capture reached it, never a role or password; empty when recorded before sources were),
    the source's database and server identity, its stream prefix (None: not recorded yet),
    publication, records stored, the LSN flushed and its streams."""

    slot: str
    source: str
    database: str
    system_id: str
    stream_prefix: str | None
    publication: str
    records: int
    flush_lsn: int
    last_commit_ts: datetime | None
    streams: tuple[str, ...]

    @property
    def shown_source(self) -> str:
        """The source for a listing: its address, else its database."""
        return self.source or f"database {self.database}"

    def as_json(self) -> dict[str, Any]:
        """JSON-ready fields (the LSN as PostgreSQL writes it)."""
        from lakefold.core.wal import format_lsn

        return {"slot": self.slot, "source": self.shown_source, "database": self.database,
                "stream_prefix": self.stream_prefix, "publication": self.publication,
                "records": self.records, "flush_lsn": format_lsn(self.flush_lsn),
                "last_commit_ts": self.last_commit_ts.isoformat() if self.last_commit_ts
                else None, "streams": list(self.streams)}


def list_captures(conn: psycopg.Connection[Any]) -> list[CaptureInfo]:
    """Every capture the store records, by slot (none in a store without the tables)."""
    if not _ddl.is_installed(conn):
        return []
    return [CaptureInfo(str(r[0]), str(r[1]), str(r[2]), str(r[3]), r[4], str(r[5]),
                        int(r[6]), int(r[7]), r[8], tuple(r[9]))
            for r in conn.execute(_CAPTURES).fetchall()]
