"""The Tantivy search target: one commit per batch with its id, upsert/delete, queries."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest

from lakefold.projections.exceptions import IncompatibleTargetError, ProjectionNotFoundError
from lakefold.projections.targets._search import (
    IndexLayout,
    SearchIndexReader,
    SearchIndexWriter,
    committed_batch,
)

pytestmark = pytest.mark.timeout(60)

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("description", pa.string()),
                    ("price", pa.decimal128(10, 2)), ("sku", pa.string()),
                    ("updated", pa.timestamp("us", tz="UTC")), ("_position", pa.int64()),
                    ("_deleted", pa.bool_())])


def table(*items: dict[str, object]) -> pa.Table:
    return pa.Table.from_pylist(list(items), schema=SCHEMA)


def product(i: int, name: str, description: str, deleted: bool = False) -> dict[str, object]:
    return {"id": i, "name": name, "description": description, "price": Decimal("9.99"),
            "sku": f"SKU-{i}", "updated": dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
            "_position": i, "_deleted": deleted}


@pytest.fixture
def layout():
    return IndexLayout.from_arrow(SCHEMA, key="id", text=("name", "description"))


def test_upsert_delete_query_and_checkpoint(tmp_path, layout):
    path = tmp_path / "idx"
    writer = SearchIndexWriter(path, layout)
    assert writer.checkpoint is None
    writer.write(table(product(1, "Red kettle", "boils water quickly"),
                       product(2, "Blue mug", "holds coffee")), batch_id=0)
    writer.write(table(product(1, "Red kettle", "boils water slowly"),
                       product(2, "", "", deleted=True)), batch_id=1)
    reader = SearchIndexReader(lambda view: str(path))
    hits = reader.search("products", "kettle")
    assert [h.key for h in hits] == ["1"]
    assert hits[0].document["description"] == "boils water slowly"
    assert hits[0].document["sku"] == "SKU-1"
    assert reader.search("products", "coffee") == []
    assert reader.search("products", "sku:SKU-1")[0].key == "1"
    assert (reader.get("products", 1) or {})["name"] == "Red kettle"
    assert reader.get("products", 2) is None
    assert reader.count("products") == 1
    assert reader.search("products", "*") and all(h.key == "1" for h in reader.search(
        "products", "*"))
    writer.close()
    # a new writer (after a crash) finds the batch id in the last commit and skips replays
    again = SearchIndexWriter(path, layout)
    assert again.checkpoint == 1
    assert again.write(table(product(3, "Green", "x")), batch_id=1).skipped
    assert reader.get("products", 3) is None
    assert again.write(table(product(3, "Green", "x")), batch_id=2).upserted == 1
    again.close()


def test_a_null_key_is_a_document_only_where_the_target_takes_null_keys(tmp_path):
    """A view's group of NULLs is a document of its own (read back by the key None); a
    projection's row with a NULL key is a bad row."""
    layout = IndexLayout.from_arrow(SCHEMA, key="sku", text=("name",))
    writer = SearchIndexWriter(tmp_path / "views", layout, null_keys=True)
    writer.write(table({**product(1, "no sku", "x"), "sku": None},
                       product(2, "with sku", "y")), batch_id=0)
    reader = SearchIndexReader(lambda view: str(tmp_path / "views"))
    assert (reader.get("v", None) or {})["name"] == "no sku"
    assert (reader.get("v", "SKU-2") or {})["name"] == "with sku"
    writer.write(table({**product(1, "", "", deleted=True), "sku": None}), batch_id=1)
    assert reader.get("v", None) is None and reader.count("v") == 1
    writer.close()
    rejected: list[tuple[dict[str, object], str]] = []
    strict = SearchIndexWriter(tmp_path / "projection", layout)
    strict.write(table({**product(1, "no sku", "x"), "sku": None}), batch_id=0,
                 rejected=rejected)
    assert len(rejected) == 1 and "null key" in rejected[0][1]
    strict.close()


def test_uncommitted_batch_leaves_nothing(tmp_path, layout):
    path = tmp_path / "idx"
    writer = SearchIndexWriter(path, layout)
    writer.write(table(product(1, "a", "b")), batch_id=0)
    rejected: list[tuple[dict[str, object], str]] = []
    writer.write(table(product(2, "c", "d")), batch_id=1, rejected=rejected)
    import tantivy

    index = tantivy.Index.open(str(path))
    assert committed_batch(index) == 1


def test_layout_validation():
    with pytest.raises(IncompatibleTargetError, match="key column 'nope'"):
        IndexLayout.from_arrow(SCHEMA, key="nope", text=("name",))
    with pytest.raises(IncompatibleTargetError, match=r"price.*not a string"):
        IndexLayout.from_arrow(SCHEMA, key="id", text=("price",))
    with pytest.raises(IncompatibleTargetError, match=r"\['body'\] are not in the output"):
        IndexLayout.from_arrow(SCHEMA, key="id", text=("body",))


def test_reader_follows_the_resolved_generation(tmp_path, layout):
    paths = {"current": tmp_path / "g1"}
    for gen in ("g1", "g2"):
        w = SearchIndexWriter(tmp_path / gen, layout)
        w.write(table(product(1, f"item {gen}", "text")), batch_id=0)
        w.close()
    reader = SearchIndexReader(lambda view: str(paths["current"]), pointer_ttl=0)
    assert reader.search("p", "g1")[0].document["name"] == "item g1"
    paths["current"] = tmp_path / "g2"
    assert reader.search("p", "g2")[0].document["name"] == "item g2"
    paths["current"] = tmp_path / "g3"
    with pytest.raises(ProjectionNotFoundError, match="no index yet"):
        reader.search("p", "x")
