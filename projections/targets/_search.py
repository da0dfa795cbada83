"""The search-index target (Tantivy on disk) and its query API.

One generation is one index directory. Each output row is one document whose id is the key
(field ``_key``, an exact term): an upsert deletes the key's document by term and adds the new
one; a row with ``_deleted`` only deletes it.

Exactly-once effect: each batch is one Tantivy commit. The batch id is stored *in that commit*
as a checkpoint document (``_key`` = ``\\x00checkpoint``, field ``_batch``): tantivy-py 0.27 does
not expose Tantivy's commit payload, and a document in the same commit is just as atomic. A
batch whose id is not above the committed checkpoint is skipped, so a replay after a crash is a
no-op; a crash before the commit leaves nothing of the batch behind. Queries never match the
checkpoint document.

A batch that holds a truncate of the source (``replace``) deletes every document first, in the
same commit: the index then holds the batch's rows, all of them after the truncate.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import tantivy

from lakefold.projections.definitions._codec import key_text
from lakefold.projections.definitions._model import DELETED_COLUMN, POSITION_COLUMN
from lakefold.projections.definitions._targets import (
    GenerationTarget,
    Rejected,
    TargetBatch,
    TargetContext,
)
from lakefold.projections.exceptions import (
    IncompatibleTargetError,
    ProjectionNotFoundError,
    TargetError,
)
from lakefold.projections.targets._search_matches import MatchedText, MatchFinder

if TYPE_CHECKING:
    from lakefold.projections.definitions._target_specs import SearchIndexTarget

KEY_FIELD = "_key"
BATCH_FIELD = "_batch"
CHECKPOINT_ID = "\x00checkpoint"
_WRITER_HEAP = 64_000_000


def _field_kind(data_type: pa.DataType) -> str:
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return "string"
    if pa.types.is_boolean(data_type):
        return "bool"
    if pa.types.is_integer(data_type):
        return "int"
    if pa.types.is_floating(data_type) or pa.types.is_decimal(data_type):
        return "float"
    if pa.types.is_timestamp(data_type) or pa.types.is_date(data_type):
        return "date"
    return "json"


@dataclass(frozen=True)
class IndexLayout:
    """How output columns map to index fields: ``text`` columns are tokenized, other strings
    are exact terms, numbers/dates are indexed fast fields, anything else is stored as JSON."""

    key: str
    text: tuple[str, ...]
    fields: tuple[tuple[str, str], ...]

    @classmethod
    def from_arrow(cls, schema: pa.Schema, *, key: str, text: tuple[str, ...]) -> IndexLayout:
        """Check the output schema against the target and derive the layout."""
        names = schema.names
        if key not in names:
            raise IncompatibleTargetError(
                f"the search target's key column {key!r} is not in the output columns {names}"
            )
        fields: list[tuple[str, str]] = []
        for name in names:
            if name in (DELETED_COLUMN, KEY_FIELD, BATCH_FIELD):
                continue
            kind = _field_kind(schema.field(name).type)
            if name in text:
                if kind != "string":
                    raise IncompatibleTargetError(
                        f"search text column {name!r} is {schema.field(name).type}, not a "
                        "string; cast it to string in the projection or drop it from text=[...]"
                    )
                kind = "text"
            fields.append((name, kind))
        missing = [t for t in text if t not in names]
        if missing:
            raise IncompatibleTargetError(
                f"search text columns {missing} are not in the output columns {names}"
            )
        return cls(key=key, text=text, fields=tuple(fields))

    def schema(self) -> tantivy.Schema:
        builder = tantivy.SchemaBuilder()
        builder.add_text_field(KEY_FIELD, stored=True, tokenizer_name="raw")
        builder.add_integer_field(BATCH_FIELD, stored=True, indexed=True)
        for name, kind in self.fields:
            if name == POSITION_COLUMN:
                builder.add_integer_field(name, stored=True, indexed=True, fast=True)
            elif kind == "text":
                builder.add_text_field(name, stored=True, tokenizer_name="en_stem")
            elif kind in ("string", "json"):
                builder.add_text_field(name, stored=True, tokenizer_name="raw")
            elif kind == "bool":
                builder.add_boolean_field(name, stored=True, indexed=True)
            elif kind == "int":
                builder.add_integer_field(name, stored=True, indexed=True, fast=True)
            elif kind == "float":
                builder.add_float_field(name, stored=True, indexed=True, fast=True)
            else:
                builder.add_date_field(name, stored=True, indexed=True, fast=True)
        return builder.build()

    def document(self, row: dict[str, Any], key: str) -> tantivy.Document:
        doc = tantivy.Document()
        doc.add_text(KEY_FIELD, key)
        for name, kind in self.fields:
            value = row.get(name)
            if value is None:
                continue
            if kind in ("text", "string"):
                doc.add_text(name, str(value))
            elif kind == "json":
                doc.add_text(name, json.dumps(value, default=str, sort_keys=True))
            elif kind == "bool":
                doc.add_boolean(name, bool(value))
            elif kind == "int":
                doc.add_integer(name, int(value))
            elif kind == "float":
                doc.add_float(name, float(value))
            else:
                if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
                    value = dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC)
                doc.add_date(name, value)
        return doc


def _open_or_create(path: Path, layout: IndexLayout | None) -> tantivy.Index:
    if (path / "meta.json").exists():
        return tantivy.Index.open(str(path))
    if layout is None:
        raise ProjectionNotFoundError(f"no search index at {path}")
    path.mkdir(parents=True, exist_ok=True)
    return tantivy.Index(layout.schema(), path=str(path))


def committed_batch(index: tantivy.Index) -> int | None:
    """The batch id stored with the index's last commit (None for a fresh index)."""
    index.reload()
    searcher = index.searcher()
    query = tantivy.Query.term_query(index.schema, KEY_FIELD, CHECKPOINT_ID)
    hits = searcher.search(query, limit=1).hits
    if not hits:
        return None
    values = searcher.doc(hits[0][1]).to_dict().get(BATCH_FIELD) or []
    return int(values[0]) if values else None


@dataclass(frozen=True)
class SearchWriteResult:
    upserted: int
    deleted: int
    skipped: bool


class SearchIndexWriter:
    """Writes batches into one generation's index directory: one commit per batch."""

    def __init__(self, path: str | Path, layout: IndexLayout, *, null_keys: bool = False
                 ) -> None:
        """``null_keys``: a NULL key is a document id (``NULL_KEY``), not a bad row."""
        self.path = Path(path)
        self.layout = layout
        self.null_keys = null_keys
        self._index = _open_or_create(self.path, layout)
        self._writer = self._index.writer(heap_size=_WRITER_HEAP, num_threads=1)
        self._last = committed_batch(self._index)

    def close(self) -> None:
        self._writer.wait_merging_threads()

    @property
    def checkpoint(self) -> int | None:
        return self._last

    def write(self, rows: pa.Table, *, batch_id: int,
              rejected: list[tuple[dict[str, Any], str]] | None = None,
              repair: bool = False, replace: bool = False) -> SearchWriteResult:
        """Apply ``rows`` as batch ``batch_id`` in one commit, or skip it if the index already
        holds it. Rows that cannot be indexed go to ``rejected`` (or raise when it is None).
        ``repair``: apply even at or below the checkpoint (a targeted rebuild, which passes
        the current checkpoint so that it stays where it is). ``replace``: delete every
        document first, in the same commit (the source was truncated before these rows)."""
        if not repair and self._last is not None and batch_id <= self._last:
            return SearchWriteResult(0, 0, skipped=True)
        upserted = deleted = 0
        latest: dict[str, dict[str, Any]] = {}
        if POSITION_COLUMN in rows.column_names and rows.num_rows > 1:
            rows = rows.sort_by([(POSITION_COLUMN, "ascending")])
        for row in _rows(rows):  # the last row of a key (by position) in the batch wins
            try:
                latest[key_text(row.get(self.layout.key), nulls=self.null_keys)] = row
            except TargetError as e:
                if rejected is None:
                    raise
                rejected.append((row, str(e)))
        try:
            if replace:
                self._writer.delete_all_documents()
            for key, row in latest.items():
                self._writer.delete_documents_by_term(KEY_FIELD, key)
                if row.get(DELETED_COLUMN):
                    deleted += 1
                    continue
                try:
                    document = self.layout.document(row, key)
                except (TypeError, ValueError, OverflowError) as e:
                    if rejected is None:
                        raise TargetError(f"cannot index row {row!r}: {e}") from e
                    rejected.append((row, str(e)))
                    continue
                self._writer.add_document(document)
                upserted += 1
            self._writer.delete_documents_by_term(KEY_FIELD, CHECKPOINT_ID)
            marker = tantivy.Document()
            marker.add_text(KEY_FIELD, CHECKPOINT_ID)
            marker.add_integer(BATCH_FIELD, batch_id)
            self._writer.add_document(marker)
            self._writer.commit()
        except BaseException:
            self._writer.rollback()
            raise
        self._last = batch_id
        return SearchWriteResult(upserted, deleted, skipped=False)


def _rows(table: pa.Table) -> Iterator[dict[str, Any]]:
    for batch in table.to_batches(max_chunksize=10_000):
        yield from batch.to_pylist()


def _plain(document: tantivy.Document) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, values in document.to_dict().items():
        if name == BATCH_FIELD:
            continue
        result[name] = values[0] if len(values) == 1 else values
    key = result.pop(KEY_FIELD, None)
    result.setdefault("_id", key)
    return result


@dataclass(frozen=True)
class SearchHit:
    """One matching document: its key, score and stored fields, and ``matched``: the text of
    each text field where the query matched, with the matched terms' ranges (why it ranks
    where it does)."""

    key: str
    score: float
    document: dict[str, Any]
    matched: dict[str, MatchedText] = field(default_factory=dict)


class SearchIndexReader:
    """Queries search views by NAME; the index directory of the current generation comes from
    ``resolve`` (the catalog), re-resolved at most every ``pointer_ttl`` seconds, so a reader
    moves to a new generation right after a switch and never reads one being built."""

    def __init__(self, resolve: Callable[[str], str], *, pointer_ttl: float = 0.5) -> None:
        self._resolve = resolve
        self._ttl = pointer_ttl
        self._open: dict[str, tuple[float, str, tantivy.Index, list[str]]] = {}
        self._lock = threading.Lock()

    def _index(self, view: str) -> tuple[tantivy.Index, list[str]]:
        with self._lock:
            now = time.monotonic()
            cached = self._open.get(view)
            if cached is not None and now - cached[0] < self._ttl:
                return cached[2], cached[3]
            path = self._resolve(view)
            if cached is not None and cached[1] == path:
                self._open[view] = (now, path, cached[2], cached[3])
                return cached[2], cached[3]
            if not (Path(path) / "meta.json").exists():
                raise ProjectionNotFoundError(
                    f"search view {view!r} has no index yet at {path}; start the projection "
                    "with `lakefold run` and wait for its first batch"
                )
            index = tantivy.Index.open(path)
            text_fields = _text_fields(path)
            self._open[view] = (now, path, index, text_fields)
            return index, text_fields

    def search(self, view: str, query: str, *, limit: int = 10,
               fields: list[str] | None = None) -> list[SearchHit]:
        """Documents of ``view`` matching ``query`` (Tantivy query syntax), best first.
        ``fields``: the default fields for terms without a field (default: text fields)."""
        index, text_fields = self._index(view)
        index.reload()
        defaults = fields or text_fields
        try:
            parsed = index.parse_query(query, defaults)
        except ValueError as e:
            raise TargetError(f"cannot parse search query {query!r}: {e}") from e
        not_checkpoint = tantivy.Query.term_query(index.schema, KEY_FIELD, CHECKPOINT_ID)
        combined = tantivy.Query.boolean_query([
            (tantivy.Occur.Must, parsed), (tantivy.Occur.MustNot, not_checkpoint)])
        searcher = index.searcher()
        finder = MatchFinder(searcher, parsed, index.schema, text_fields)
        hits = []
        for score, address in searcher.search(combined, limit=limit).hits:
            stored = searcher.doc(address)
            document = _plain(stored)
            hits.append(SearchHit(key=str(document.get("_id")), score=float(score),
                                  document=document, matched=finder.matched(stored)))
        return hits

    def get(self, view: str, key: object) -> dict[str, Any] | None:
        """The document with id ``key``, or None."""
        index, _ = self._index(view)
        return read_document(index, key)

    def count(self, view: str) -> int:
        """How many documents ``view`` holds."""
        index, _ = self._index(view)
        index.reload()
        searcher = index.searcher()
        return int(searcher.num_docs) - (1 if committed_batch(index) is not None else 0)


def read_document(index: tantivy.Index, key: object) -> dict[str, Any] | None:
    """The document with id ``key`` in ``index`` (reloaded first), or None."""
    index.reload()
    searcher = index.searcher()
    query = tantivy.Query.term_query(index.schema, KEY_FIELD, key_text(key, nulls=True))
    hits = searcher.search(query, limit=1).hits
    return _plain(searcher.doc(hits[0][1])) if hits else None


def _text_fields(path: str) -> list[str]:
    """Tokenized text fields of the index at ``path``, from its meta.json: the default fields
    of a query."""
    meta = json.loads((Path(path) / "meta.json").read_text())
    found = []
    for entry in meta.get("schema", []):
        indexing = (entry.get("options") or {}).get("indexing") or {}
        if entry.get("type") == "text" and indexing.get("tokenizer") not in (None, "raw"):
            found.append(str(entry["name"]))
    return found


def drop_index(path: str | Path) -> None:
    """Delete a generation's index directory (after a switch)."""
    import shutil

    shutil.rmtree(path, ignore_errors=True)



class SearchGenerationTarget(GenerationTarget):
    """One generation's index directory, as the ``Target`` protocol sees it (``_targets``):
    a batch is one Tantivy commit holding its batch id (``SearchIndexWriter``). The index's
    layout comes from the context's output schema (else from the first batch)."""

    kind = "search"

    def __init__(self, spec: SearchIndexTarget, location: str, context: TargetContext) -> None:
        super().__init__(location, context)
        self.spec = spec
        self._writer: SearchIndexWriter | None = None

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.spec.key,)

    def _layout(self, schema: pa.Schema) -> IndexLayout:
        return IndexLayout.from_arrow(schema, key=self.spec.key, text=self.spec.text)

    def _opened(self, rows: pa.Table) -> SearchIndexWriter:
        if self._writer is None:
            self._writer = SearchIndexWriter(
                self.location, self._layout(self.context.schema or rows.schema),
                null_keys=self.context.null_keys)
        return self._writer

    def write(self, rows: pa.Table, batch: TargetBatch, *,
              rejected: Rejected | None = None) -> bool:
        result = self._opened(rows).write(rows, batch_id=batch.batch_id, rejected=rejected,
                                          replace=bool(batch.truncates))
        return not result.skipped

    def _index(self) -> tantivy.Index | None:
        if not (Path(self.location) / "meta.json").exists():
            return None
        return tantivy.Index.open(self.location)

    def read(self, keys: Sequence[object]) -> dict[str, dict[str, Any]]:
        index = self._index()
        if index is None:
            return {}
        found = {}
        for key in keys:
            document = read_document(index, key)
            if document is not None:
                found[key_text(key, nulls=True)] = document
        return found

    def stored_keys(self) -> list[object]:
        index = self._index()
        if index is None:
            return []
        index.reload()
        searcher = index.searcher()
        hits = searcher.search(tantivy.Query.all_query(), limit=max(1, searcher.num_docs))
        held = [searcher.doc(address).to_dict()[KEY_FIELD][0] for _, address in hits.hits]
        return [k for k in held if k != CHECKPOINT_ID]

    def checkpoint(self) -> int | None:
        if self._writer is not None:
            return self._writer.checkpoint
        index = self._index()
        return None if index is None else committed_batch(index)

    def repair(self, rows: pa.Table, position: int) -> None:
        """One commit that keeps the batch checkpoint where it is (through this target's
        writer when it has one: an index takes one writer at a time)."""
        if self._writer is not None:
            self._writer.write(rows, batch_id=self._writer.checkpoint or 0, repair=True)
            return
        layout = self._layout(pa.schema([f for f in rows.schema if f.name != DELETED_COLUMN]))
        search = SearchIndexWriter(self.location, layout)
        try:
            search.write(rows, batch_id=search.checkpoint or 0, repair=True)
        finally:
            search.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()  # consumes the writer: a later write opens a new one
            self._writer = None

    @classmethod
    def drop_storage(cls, location: str, context: TargetContext) -> None:
        drop_index(location)
