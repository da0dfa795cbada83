"""A search hit says why it matched: the text of each field that matched, with the matched
terms marked, in the API, ``lakefold search`` and the demo; and the demo's products describe
themselves (a description is never another product's text)."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from lakefold.cli import app
from lakefold.demo import _shop
from lakefold.projections import SearchIndexReader
from lakefold.projections.operations import Catalog, SinkRoots
from lakefold.projections.targets._search import IndexLayout, SearchIndexWriter

pytestmark = pytest.mark.timeout(60)
PRODUCTS = [
    {"id": 10, "name": "birch table", "description": "A oak lamp made to last"},
    {"id": 22, "name": "oak chair", "description": "A birch stool made to last"},
    {"id": 39, "name": "cobalt lamp", "description": "A linen rug made to last"},
    {"id": 40, "name": "clay mug", "description": "A clay mug made to last"},
    {"id": 41, "name": "café crème bowl", "description": "Clay, glazed"},
]


def _index(path: Path) -> None:
    layout = IndexLayout.from_arrow(
        pa.schema([("id", pa.int64()), ("name", pa.string()), ("description", pa.string())]),
        key="id", text=("name", "description"))
    writer = SearchIndexWriter(path, layout)
    writer.write(pa.Table.from_pylist(PRODUCTS), batch_id=0)
    writer.close()


def test_each_hit_names_the_text_that_matched(tmp_path: Path) -> None:
    from lakefold.projections.targets._search_matches import MatchedText

    _index(tmp_path / "index")
    reader = SearchIndexReader(lambda view: str(tmp_path / "index"))
    hits = reader.search("products", "oak lamp")
    assert hits[0].key == "10"  # both words, in its description: BM25 ranks it first
    assert hits[0].matched == {"description": MatchedText("A oak lamp made to last",
                                                          ((2, 5), (6, 10)))}
    assert hits[0].matched["description"].marked() == "A [oak] [lamp] made to last"
    rest = {h.key: h.matched for h in hits[1:]}
    assert rest == {"22": {"name": MatchedText("oak chair", ((0, 3),))},
                    "39": {"name": MatchedText("cobalt lamp", ((7, 11),))}}
    (only_name,) = reader.search("products", "name:clay")
    assert only_name.matched == {"name": MatchedText("clay mug", ((0, 4),))}
    (accented,) = reader.search("products", "bowl")  # ranges count characters, not bytes
    assert accented.matched["name"].marked() == "café crème [bowl]"


@pytest.fixture
def env(pg, tmp_path):
    with Catalog(pg.dsn, SinkRoots.under(tmp_path)) as catalog:
        catalog.install()
        catalog.ensure("product_search", target_kind="search", fingerprint="f",
                       keep_generations=1, definition={"sources": []})
        _index(Path(catalog.current("product_search").location("search")))
    return {"LAKEFOLD_STORE_DSN": pg.dsn, "LAKEFOLD_HOME": str(tmp_path), "COLUMNS": "200"}


def test_the_search_command_shows_what_matched(env, monkeypatch) -> None:
    from lakefold.cli import _projections as _cli_projections

    # the command's console was made when its module was imported, by whichever test came
    # first (COLUMNS of that moment): give it the width the rows are checked at
    monkeypatch.setattr(_cli_projections._out, "width", 200)
    result = CliRunner().invoke(app, ["search", "product_search", "oak lamp"], env=env)
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if "made to last" in line
            or "chair" in line]
    assert "birch table" in rows[0] and "description: A [oak] [lamp] made to last" in rows[0]
    result = CliRunner().invoke(app, ["search", "product_search", "oak lamp", "--json"],
                                env=env)
    first = json.loads(result.output)[0]
    assert first["key"] == "10"
    assert first["matched"] == {"description": {"text": "A oak lamp made to last",
                                                "highlights": [[2, 5], [6, 10]]}}


def test_the_demo_products_describe_themselves(pg) -> None:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        _shop.create_schema(conn)
        _shop.run_workload(conn, _shop.Workload(orders=50))
        rows = conn.execute("SELECT id, name, description FROM shop.products").fetchall()
    assert rows
    for pid, name, description in rows:
        assert name in description, (pid, name, description)
