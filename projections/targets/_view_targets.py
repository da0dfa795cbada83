"""A view's target kept equal to its output stream, exactly once.

The maintainer (``_view_maintainer``) writes a view's rows as changes to a derived stream. This
writer applies that stream to the view's target (any ``Target``: Delta, Redis, search) a range
at a time: the last record of each key in the range becomes an upsert, or a delete, and the
range goes to the target as one batch whose id is the last position it holds. The target
stores that id with the data (its own checkpoint: Delta's app transaction, Redis's Lua guard,
the search index's commit), so after a crash the writer starts again after the target's
checkpoint, and a range applied twice is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.compute as pc

from lakefold.core.arrow_tables import latest_per_key
from lakefold.projections.definitions._model import DELETED_COLUMN
from lakefold.projections.definitions._targets import GenerationTarget, TargetBatch
from lakefold.store import ChangelogStore
from lakefold.store.internals import data_columns

#: The most records one target batch applies.
BATCH_RECORDS = 100_000


@dataclass(frozen=True)
class TargetStep:
    """One range applied: ``[start, end)`` of the stream, rows upserted and deleted."""

    start: int
    end: int
    upserts: int
    deletes: int


class ViewTargetWriter:
    """Applies one view generation's output stream to one generation of its target."""

    def __init__(self, store_dsn: str, stream: str, target: GenerationTarget, *,
                 reader: str) -> None:
        self.dsn = store_dsn
        self.stream = stream
        self.target = target
        #: The durable reader this writer is: compaction of the stream never passes it.
        self.reader = reader
        self.store = ChangelogStore(store_dsn)

    def close(self) -> None:
        self.store.close()

    def step(self, *, max_records: int = BATCH_RECORDS) -> TargetStep | None:
        """Apply the records after the target's checkpoint (at most ``max_records``); None
        when the target holds everything."""
        start = (self.target.checkpoint() or 0) + 1
        head = self.store.head(self.stream)
        if head < start:
            return None
        end = min(head + 1, start + max_records)
        records = self.store.read_range(self.stream, start, end)
        rows = latest_per_key(records, self.target.keys)
        deleted = pc.equal(rows.column("_op"), "delete")
        # Every row reflects the range's end (the batch's position): a view's table holds its
        # own columns only, no stream positions.
        data = data_columns(rows)
        data = data.append_column(DELETED_COLUMN, deleted)
        self.target.write(data, TargetBatch(end - 1, end - 1))
        self.store.commit_reader(self.reader, self.stream, end - 1)
        deletes = int(pc.sum(deleted).as_py() or 0)
        return TargetStep(start, end, data.num_rows - deletes, deletes)
