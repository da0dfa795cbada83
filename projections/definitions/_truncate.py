"""What a captured TRUNCATE does to a view (issue 18, item 5): the policy.

The source layer applies the mode chosen here (``lakefold.spark._source_truncates``).

A truncate record (``_type`` ``truncate``, every column null; also written by ``lakefold
capture recover`` before its fresh snapshot) means "every row of the table so far is gone". It
is an ordered event: within a micro-batch, the stream's records before it are wiped and the
records after it apply. Each target applies it as follows:

- **Delta upsert, Redis, search** (a transform): the view's rows that came from the stream
  go. The source drops the stream's records up to the batch's last truncate (mode ``cut``), so
  the transform sees only what follows it, and the sink replaces the view's content with the
  batch in one step: a Delta merge that also deletes every row the batch does not name (one
  transaction, with the batch's app transaction), one Tantivy commit that deletes every
  document first, and in Redis the deletion of every key whose stored position is at or below
  the truncate's (idempotent: a replay deletes nothing newer, and the positions stay as
  tombstones so no older write comes back).
- **Delta SCD2**: history is kept. The source drops only the truncate records (mode
  ``drop``); the sink closes every version open at the truncate (``valid_to`` = the
  truncate's commit time), those of the table and those the batch opened before it, and the
  changes after it open new versions.
- **Delta append**: an append target is a log of changes, and a truncate is one of them: the
  record passes through the transform like any other (mode ``keep``; its ``_type`` is
  ``truncate``, its columns null), and nothing appended before is deleted.
- **Folds**: the source replaces each truncate record with one record of type ``truncate``
  per key the fold holds state for (mode ``fanout``; the keys come from ``FoldKeys`` in
  ``lakefold.spark._source_truncates``, which the sink keeps up to date), in the truncate's
  place among the stream's records. A key that the batch itself gives state before the
  truncate is not known yet: the stream's records
  before a truncate carry its position (``_truncated_at``), and the fold adds the truncate
  for their key. A fold over one source drops the state (the key is deleted from the view);
  a fold over several sources calls its ``on("truncate")`` handler, which clears that
  source's part of the state (only the handler knows which part that is, so such a fold must
  register one).

"The rows that came from that stream" is exact only when a transform reads the changelog
alone: a transform over several sources (one a changelog) writing a keyed target is refused
at registration (``check_truncatable``); use a fold, or one projection per source. An append
target may read several sources (nothing is deleted there).

Exactly once: the source's choices depend only on the store (records below the head are final),
so a replayed batch reads the same records; each target's replace is part of the batch's
idempotent commit (Delta app transaction, Tantivy checkpoint), or idempotent by position
(Redis).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakefold.projections.exceptions import ProjectionDefinitionError
from lakefold.spark.internals import TRUNCATE, ChangelogSource, Mode

if TYPE_CHECKING:
    from lakefold.projections.definitions._targets import TargetedProjection

#: Column of a fold's output (not written to the target): the key the row belongs to.
FOLD_KEY_COLUMN = "_fold_key"


def reads_changelog(projection: TargetedProjection) -> bool:
    """True when a source of ``projection`` is a changelog (only those have truncates)."""
    return any(isinstance(s, ChangelogSource) for s in projection.sources)


def source_mode(projection: TargetedProjection) -> Mode:
    """How ``projection``'s changelog sources deliver truncate records."""
    if projection.fold is not None:
        return "fanout"
    return projection.target.truncate_mode


def check_truncatable(projection: TargetedProjection) -> None:
    """Refuse a definition whose view cannot apply a truncate exactly (see the module
    docstring): a transform over several sources, one a changelog, into a keyed target. Folds
    are checked by ``check_fold_truncates`` once their handlers are known."""
    if projection.fold is not None or len(projection.sources) < 2:
        return
    if source_mode(projection) == "keep" or not reads_changelog(projection):
        return
    tables = " or ".join(s.table for s in projection.sources if isinstance(s, ChangelogSource))
    raise ProjectionDefinitionError(
        f"projection {projection.name}: it reads several sources "
        f"({'; '.join(s.label for s in projection.sources)}) into a {projection.target.kind} "
        f"target. A TRUNCATE of {tables} (also written by `lakefold capture recover`) must "
        "remove exactly the rows that came from that table, and a transform's output does "
        "not say which source a row came from. Define one projection per source, or a Fold "
        "(whose on('truncate') handler clears the table's part of each key), or write to "
        "delta_table('append')"
    )


def check_fold_truncates(projection: TargetedProjection) -> None:
    """Refuse a fold over several sources, one a changelog, without an ``on("truncate")``
    handler: only the handler knows which part of a key's state came from the table."""
    fold = projection.fold
    if fold is None or len(projection.sources) < 2 or not reads_changelog(projection):
        return
    if TRUNCATE in fold.handlers:
        return
    tables = " or ".join(s.table for s in projection.sources if isinstance(s, ChangelogSource))
    raise ProjectionDefinitionError(
        f"fold {projection.name} reads several sources "
        f"({'; '.join(s.label for s in projection.sources)}) but has no handler for "
        f"truncates. A TRUNCATE of {tables} (also written by `lakefold capture recover`) "
        "must clear that table's part of every key's state, which only your code knows: add "
        f"'truncate' to a handler (@{projection.name}.on(..., 'truncate')); it is called once "
        "per key with state, with a record of type 'truncate' whose source is the truncated "
        "table's alias (return None to delete the key)"
    )
