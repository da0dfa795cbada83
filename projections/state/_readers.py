"""What a projection generation holds in the changelog streams it reads, and the checks that
keep compaction from making a view silently wrong (the capture's durable readers, see
``lakefold.capture``'s ``ChangelogStore.commit_reader``).

- Every generation that reads a changelog stream (live, or being rebuilt) is a durable reader
  named ``projection:NAME@gN``. When its query starts it registers where it resumes (Spark's
  last committed offsets; 0 for a new generation), and before each micro-batch it moves its
  position to the end of the previous batch, whose effect is committed in the target and in
  Spark's checkpoint. Compaction never passes that position, so a slow or paused generation
  still reads every update and delete. A paused generation holds compaction for as long as it
  is paused (``lakefold capture streams`` names it).
- A generation that would resume after records compaction already removed and it needs (its
  registration was lost, or it is new and starts inside what compaction removed) fails with
  ``BehindCompactionError``, naming the stream, its position, the compaction and the fix.
- Targets that keep the latest state per key (Delta upsert, Redis, search) can always be
  rebuilt from a compacted stream: it holds the latest record of every key, and a reader
  starting at 0 needs no tombstone (what the tombstone deleted is gone too). A fold into them
  is taken for one too; a fold whose state depends on the versions in between (it counts
  updates) needs its streams' full history kept by hand (``keep_history``). Targets that
  keep every version (Delta ``scd2`` and ``append``) need every record. Registering such a
  projection makes the streams it reads keep their full history (no compaction), unless a
  user decided otherwise for a stream. A rebuild of one over a stream that compaction trimmed
  anyway (trimmed before the projection existed, or after the history was switched off) is
  refused, naming the compaction.
- Readers of generations that no longer run (retired, abandoned, dropped, forgotten) are
  released (``release_gone``) so that they stop holding compaction.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from lakefold.projections.definitions._api import Projection
from lakefold.projections.exceptions import BehindCompactionError
from lakefold.spark.internals import ChangelogSource

if TYPE_CHECKING:
    from lakefold.projections.state._catalog import Catalog
    from lakefold.store import ChangelogStore, ReaderBehindCompactionError

log = logging.getLogger(__name__)

READER_PREFIX = "projection:"
#: A view generation's readers: ``view:NAME@N`` (its inputs) and ``view:NAME@N:target``.
VIEW_READER_PREFIX = "view:"
_ACTIVE = ("live", "building")


def reader_name(name: str, generation: int) -> str:
    """The durable reader name of one generation of a projection."""
    return f"{READER_PREFIX}{name}@g{generation}"


def needs_history(projection: Projection) -> bool:
    """True when the target keeps every version (Delta scd2 or append), not the latest state
    per key: such a view cannot be rebuilt from a compacted stream."""
    return projection.target.keeps_history


def _what(projection: Projection) -> str:
    return projection.target.describe()


def changelog_streams(projection: Projection) -> dict[str, list[str]]:
    """Stream name → the aliases of the projection's sources that read it."""
    streams: dict[str, list[str]] = {}
    for source in projection.sources:
        if isinstance(source, ChangelogSource):
            streams.setdefault(source.table, []).append(source.alias)
    return streams


def _on_object_store(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def _read_text(location: str) -> str | None:
    """The text of the file at ``location`` (a local path, or an ``s3a://`` object of the lake's
    bucket); None when it does not exist."""
    if not _on_object_store(location):
        try:
            return Path(location.removeprefix("file://")).read_text()
        except FileNotFoundError:
            return None
    from lakefold.core.object_store import filesystem_for

    fs, path = filesystem_for(location)
    try:
        with fs.open_input_stream(path) as stream:
            return bytes(stream.read()).decode()
    except FileNotFoundError:
        return None


def _names(location: str) -> list[str]:
    """The names in the directory at ``location`` ([] when it does not exist)."""
    if not _on_object_store(location):
        try:
            return [p.name for p in Path(location.removeprefix("file://")).iterdir()]
        except FileNotFoundError:
            return []
    import pyarrow.fs as pafs

    from lakefold.core.object_store import filesystem_for

    fs, path = filesystem_for(location)
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return [info.base_name for info in infos]


def remove_checkpoint(location: str) -> None:
    """Delete a generation's Spark checkpoint directory, local or on the bucket (gone already:
    nothing to do)."""
    if not _on_object_store(location):
        shutil.rmtree(location.removeprefix("file://"), ignore_errors=True)
        return
    from lakefold.core.object_store import filesystem_for

    fs, path = filesystem_for(location)
    try:
        fs.delete_dir(path)
    except FileNotFoundError:
        pass


def read_offsets(checkpoint_dir: str, batch_id: int) -> dict[str, int] | None:
    """Source alias → end position of ``batch_id``, from Spark's offset log."""
    text = _read_text(f"{checkpoint_dir.rstrip('/')}/offsets/{batch_id}")
    if text is None:
        return None
    positions: dict[str, int] = {}
    for line in text.splitlines()[2:]:
        line = line.strip()
        if not line or line == "-":
            continue
        offset = json.loads(line)
        if isinstance(offset, dict) and "source" in offset and "position" in offset:
            positions[str(offset["source"])] = int(offset["position"])
    return positions


def committed_positions(checkpoint_dir: str) -> dict[str, int]:
    """Source alias → the next position a generation's query reads when it starts again: the
    end of the last batch in Spark's commit log ({} for a query that never committed one)."""
    batches = [int(name) for name in _names(f"{checkpoint_dir.rstrip('/')}/commits")
               if name.isdigit()]
    return (read_offsets(checkpoint_dir, max(batches)) or {}) if batches else {}


def _store(dsn: str) -> ChangelogStore:
    from lakefold.store import ChangelogStore

    return ChangelogStore(dsn)


def _explain(error: ReaderBehindCompactionError, projection: Projection, generation: int
             ) -> BehindCompactionError:
    """The capture's error said for a projection: what is lost, and what to do."""
    name, stream, position = projection.name, error.stream, error.position
    when = "never" if error.last_run is None else \
        error.last_run.strftime("%Y-%m-%d %H:%M:%S UTC")
    compaction = (f"compaction of {stream} (last run {when}) removed "
                  + ("records" if error.history else "deletes (tombstones past their retention)")
                  + f" up to position {error.removed_to}")
    if not error.history:
        text = (f"projection {name} (generation {generation}) has read {stream} up to position "
                f"{position}, but {compaction} that it has not read, so its view would keep "
                f"rows deleted meanwhile. Rebuild it from the compacted stream: "
                f"`lakefold rebuild {name}`")
    elif position > 0:
        text = (f"projection {name} (generation {generation}, {_what(projection)}, which keeps "
                f"every version) has read {stream} up to position {position}, but {compaction}: "
                "versions it has not read are gone, and no rebuild can bring them back. Keep "
                "the stream's full history for such views (`lakefold capture keep-history "
                f"{stream}`)")
    elif generation > 1:
        text = (f"projection {name} cannot be rebuilt: {_what(projection)} keeps every version, "
                f"but {compaction}, so a rebuild would not be the history the live generation "
                "built. The live generation stays as it is; a stream read by such a view keeps "
                "its full history when the view is registered before compaction removes "
                f"anything (`lakefold capture keep-history {stream}`)")
    else:
        text = (f"projection {name} ({_what(projection)}, which keeps every version) would read "
                f"{stream} from the start, but {compaction}: its history cannot be built, "
                "since removed records cannot be read again. Write it as a latest-state view "
                "(delta_table('upsert', ...)); register history views before compaction trims "
                "their streams (they then keep their full history, see `lakefold capture "
                "streams`)")
    return BehindCompactionError(text)


class GenerationReads:
    """The durable reader of one generation in each changelog stream it reads (see the
    module docstring). Not thread-safe; keeps one store connection until ``close``."""

    def __init__(self, dsn: str, projection: Projection, generation: int) -> None:
        self.projection = projection
        self.generation = generation
        self.reader = reader_name(projection.name, generation)
        self.streams = changelog_streams(projection)
        self._dsn = dsn
        self._handle: ChangelogStore | None = None

    def _commit(self, next_positions: Mapping[str, int]) -> None:
        from lakefold.store import ReaderBehindCompactionError

        if not self.streams:
            return
        if self._handle is None:
            self._handle = _store(self._dsn)
        history = needs_history(self.projection)
        for stream, aliases in self.streams.items():
            processed = max(0, min(int(next_positions.get(a, 0)) - 1 for a in aliases))
            try:
                self._handle.commit_reader(self.reader, stream, processed, history=history)
            except ReaderBehindCompactionError as e:
                raise _explain(e, self.projection, self.generation) from e

    def attach(self, next_positions: Mapping[str, int]) -> None:
        """Register where the generation's query resumes (source alias → next position to
        read), before it reads anything; BehindCompactionError when compaction removed
        records after it that the generation needs."""
        self._commit(next_positions)

    def advance(self, next_positions: Mapping[str, int]) -> None:
        """Before a micro-batch: everything before ``next_positions`` (the batch's start, the
        previous batch's end) is committed in the target and in Spark's checkpoint."""
        self._commit(next_positions)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def keep_history_for(dsn: str, projection: Projection) -> None:
    """When ``projection`` keeps every version, make the streams it reads keep their full
    history (compaction leaves them alone) unless that was decided for a stream already (a
    user switched it off: then its rebuilds are refused once compaction trims the stream),
    and say so; warn when compaction already removed records, which a build from the start
    will then refuse."""
    streams = changelog_streams(projection)
    if not needs_history(projection) or not streams:
        return
    with _store(dsn) as store:
        for stream in streams:
            changed = store.keep_history(
                stream, reason=f"projection {projection.name} ({_what(projection)}) needs "
                "every record", if_unset=True)
            state = store.compaction_state(stream)
            if changed:
                log.info("stream %s keeps its full history from now on: projection %s (%s) "
                         "needs every record", stream, projection.name, _what(projection))
            if changed and state.removed_to:
                log.warning(
                    "projection %s (%s) needs every record of %s, but compaction already "
                    "removed records of it up to position %d; a build of the view from the "
                    "start will be refused", projection.name, _what(projection), stream,
                    state.removed_to)


def check_rebuild(dsn: str, projection: Projection, generation: int) -> None:
    """Refuse (BehindCompactionError) to start ``generation`` from position 0 when it would
    miss records compaction removed: only targets that keep every version can."""
    from lakefold.store import ReaderBehindCompactionError

    if not needs_history(projection):
        return
    with _store(dsn) as store:
        for stream in changelog_streams(projection):
            state = store.compaction_state(stream)
            if state.removed_to:
                error = ReaderBehindCompactionError(
                    "", reader=reader_name(projection.name, generation), stream=stream,
                    position=0, removed_to=state.removed_to, last_run=state.last_run,
                    history=True)
                raise _explain(error, projection, generation)


def release_gone(dsn: str, catalog: Catalog, *, keep: Iterable[tuple[str, int]] = ()
                 ) -> list[str]:
    """Release the readers of projection generations that are neither live nor being built
    (retired, abandoned, dropped, or of projections no longer in the catalog), so that they
    stop holding compaction; returns their names. ``keep`` names generations to spare."""
    with _store(dsn) as store:
        held = {r.reader for r in store.readers() if r.reader.startswith(READER_PREFIX)}
        if not held:
            return []
        # after the readers: a generation created meanwhile registers after it exists
        active = {reader_name(g.name, g.generation) for row in catalog.projections()
                  for g in catalog.generations(row.name) if g.status in _ACTIVE}
        active |= {reader_name(name, generation) for name, generation in keep}
        gone = sorted(held - active)
        for reader in gone:
            store.release_reader(reader)
    if gone:
        log.info("released the changelog positions of %s: they no longer hold compaction",
                 ", ".join(gone))
    return gone


def compaction_holders(dsn: str) -> dict[str, dict[str, int]]:
    """Projection (or view) name → {stream: position} for each changelog stream whose
    compaction one of its generations holds (it has the stream's lowest reader position):
    what ``lakefold status`` reports, e.g. for a projection paused for days."""
    with _store(dsn) as store:
        readers = store.readers()
    lowest: dict[str, tuple[str, int]] = {}
    for held in readers:  # lowest position first, per stream
        lowest.setdefault(held.stream, (held.reader, held.position))
    holders: dict[str, dict[str, int]] = {}
    for stream, (reader, position) in lowest.items():
        for prefix, separator in ((READER_PREFIX, "@g"), (VIEW_READER_PREFIX, "@")):
            if reader.startswith(prefix):
                name = reader.removeprefix(prefix).rsplit(separator, 1)[0]
                holders.setdefault(name, {})[stream] = position
    return holders
