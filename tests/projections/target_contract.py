"""The contract every projection target must pass (the ``Target`` protocol of
``lakefold.projections.definitions._targets``), run against each real target by
``test_target_contract.py``: Delta through the real writer on a temporary directory, Redis
through the session's real server, search through a real Tantivy index. No mocks.

A case names the target's definition (``Target``); the contract opens one generation's
storage at the location ``SinkRoots`` gives its kind, as the runner does.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lakefold.projections.definitions._api import Projection
from lakefold.projections.definitions._codec import key_text
from lakefold.projections.definitions._model import ProjectionOptions, changelog
from lakefold.projections.definitions._targets import (
    GenerationTarget,
    Target,
    TargetBatch,
    TargetContext,
    drop_generation_storage,
)
from lakefold.projections.exceptions import MissingKeyError, TargetError
from lakefold.projections.state._catalog import SinkRoots
from lakefold.spark._source_truncates import Truncate

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("city", pa.string()),
                    ("_position", pa.int64()), ("_deleted", pa.bool_())])
TYPES = {"id": "bigint", "name": "string", "city": "string", "_position": "bigint",
         "_deleted": "boolean"}


@dataclass(frozen=True)
class TargetCase:
    """One target under the contract: its definition, keyed by ``id`` with text ``name``."""

    id: str
    target: Target

    def __str__(self) -> str:
        return self.id


def rows(*items: tuple[int, str, int] | tuple[int, str, int, bool]) -> pa.Table:
    """Rows (id, name, position[, deleted]); the city is derived from the name."""
    return pa.Table.from_pylist(
        [{"id": i, "name": name, "city": f"{name}-city", "_position": position,
          "_deleted": bool(rest[0]) if rest else False}
         for i, name, position, *rest in items], schema=SCHEMA)


def keys(*values: int) -> pa.Table:
    return pa.table({"id": pa.array(values, pa.int64())})


def truncated(batch_id: int, position: int) -> TargetBatch:
    return TargetBatch(batch_id, position=position, truncates=(
        Truncate(position=position, at=dt.datetime(2024, 1, 1, tzinfo=dt.UTC)),))


class TargetContract:
    """Shared behaviour of every ``Target`` (see the module docstring)."""

    @pytest.fixture
    def context(self, case: TargetCase, tmp_path: Path, request: pytest.FixtureRequest
                ) -> TargetContext:
        # Redis only for the targets that need it: the other cases run without a server.
        url = request.getfixturevalue("redis_url") if case.target.kind == "redis" else None
        return TargetContext("contract", 1, redis_url=url,
                             redis_namespace=f"t{uuid.uuid4().hex[:8]}", schema=SCHEMA)

    @pytest.fixture
    def location(self, case: TargetCase, tmp_path: Path, context: TargetContext) -> str:
        roots = SinkRoots.under(tmp_path)
        roots = SinkRoots(lake=roots.lake, search=roots.search, checkpoints=roots.checkpoints,
                          redis_namespace=context.redis_namespace)
        return roots.locations(context.projection, context.generation)[case.target.kind]

    @pytest.fixture
    def target(self, case: TargetCase, location: str, context: TargetContext
               ) -> Iterator[GenerationTarget]:
        opened = case.target.open(location, context)
        try:
            yield opened
        finally:
            opened.close()

    def reopen(self, case: TargetCase, target: GenerationTarget) -> GenerationTarget:
        """The same generation's storage opened again (a new process after a crash)."""
        target.close()
        return case.target.open(target.location, target.context)

    @staticmethod
    def names(target: GenerationTarget, *ids: int) -> dict[str, Any]:
        return {key: row["name"] for key, row in target.read(list(ids)).items()}

    @staticmethod
    def stored(target: GenerationTarget) -> list[str]:
        return sorted(key_text(k) for k in target.stored_keys())

    # ------------------------------------------------------------------ writes and reads

    def test_fresh_storage_is_empty(self, target: GenerationTarget) -> None:
        assert target.checkpoint() is None
        assert target.read([1, 2]) == {}
        assert target.stored_keys() == []
        assert target.keys == ("id",)

    def test_a_batch_is_written_with_its_checkpoint_and_read_by_key(
            self, target: GenerationTarget) -> None:
        assert target.write(rows((1, "ann", 1), (2, "bob", 2), (3, "cy", 3)), TargetBatch(0))
        assert target.checkpoint() == 0
        assert self.names(target, 1, 2, 4) == {"1": "ann", "2": "bob"}
        assert self.stored(target) == ["1", "2", "3"]

    def test_the_latest_row_of_a_key_in_a_batch_wins(self, target: GenerationTarget) -> None:
        target.write(rows((1, "old", 1), (1, "new", 2)), TargetBatch(0))
        assert self.names(target, 1) == {"1": "new"}

    # ------------------------------------------------------------------ exactly once

    def test_a_repeated_batch_id_is_a_no_op(self, target: GenerationTarget) -> None:
        assert target.write(rows((1, "ann", 1)), TargetBatch(1))
        assert not target.write(rows((1, "zed", 2), (9, "new", 3)), TargetBatch(1))
        assert self.names(target, 1, 9) == {"1": "ann"}
        assert target.checkpoint() == 1

    def test_the_checkpoint_never_moves_backwards(self, target: GenerationTarget) -> None:
        target.write(rows((1, "ann", 5)), TargetBatch(5))
        assert not target.write(rows((1, "old", 3), (2, "bob", 3)), TargetBatch(3))
        assert target.checkpoint() == 5
        assert self.names(target, 1, 2) == {"1": "ann"}
        assert target.write(rows((2, "bob", 6)), TargetBatch(6))
        assert target.checkpoint() == 6

    def test_a_reopened_target_keeps_its_checkpoint(self, case: TargetCase,
                                                    target: GenerationTarget) -> None:
        target.write(rows((1, "ann", 1)), TargetBatch(4))
        again = self.reopen(case, target)
        try:
            assert again.checkpoint() == 4
            assert not again.write(rows((1, "zed", 2)), TargetBatch(4))
            assert self.names(again, 1) == {"1": "ann"}
            assert again.write(rows((1, "zed", 2)), TargetBatch(5))
            assert self.names(again, 1) == {"1": "zed"}
        finally:
            again.close()

    # ------------------------------------------------------------------ deletes, truncates

    def test_deleted_rows_and_delete_remove_keys(self, target: GenerationTarget) -> None:
        target.write(rows((1, "ann", 1), (2, "bob", 2), (3, "cy", 3)), TargetBatch(0))
        target.write(rows((1, "ann", 4, True)), TargetBatch(1))
        assert self.stored(target) == ["2", "3"]
        assert target.delete(keys(2), TargetBatch(2, position=5))
        assert self.names(target, 1, 2, 3) == {"3": "cy"}
        assert target.checkpoint() == 2
        assert not target.delete(keys(3), TargetBatch(2, position=5))  # a replay
        assert self.stored(target) == ["3"]

    def test_truncate_removes_every_row_exactly_once(self, target: GenerationTarget) -> None:
        target.write(rows((1, "ann", 1), (2, "bob", 2)), TargetBatch(0))
        assert target.truncate(truncated(1, position=10))
        assert target.stored_keys() == [] and target.read([1, 2]) == {}
        assert target.checkpoint() == 1
        target.write(rows((3, "cy", 11)), TargetBatch(2))
        assert not target.truncate(truncated(1, position=10))  # a replay removes nothing
        assert self.stored(target) == ["3"]

    def test_a_batch_with_a_truncate_replaces_the_content(
            self, target: GenerationTarget) -> None:
        target.write(rows((1, "ann", 1), (2, "bob", 2)), TargetBatch(0))
        target.write(rows((2, "bea", 11)), truncated(1, position=10))
        assert self.names(target, 1, 2) == {"2": "bea"}

    def test_replace_rewrites_the_rows_of_some_keys(self, target: GenerationTarget) -> None:
        target.write(rows((1, "ann", 1), (2, "bob", 2), (3, "cy", 3)), TargetBatch(0))
        # keys 1 and 2 are recomputed: 1 changes, 2 vanished, 4 is new; 3 is not touched
        assert target.replace(keys(1, 2, 4), rows((1, "ana", 5), (4, "dee", 5)),
                              TargetBatch(1, position=5))
        assert self.names(target, 1, 2, 3, 4) == {"1": "ana", "3": "cy", "4": "dee"}
        assert not target.replace(keys(3), rows(), TargetBatch(1, position=5))  # a replay
        assert self.stored(target) == ["1", "3", "4"]

    # ------------------------------------------------------------------ repair, drop

    def test_repair_leaves_the_batch_checkpoint(self, target: GenerationTarget) -> None:
        target.write(rows((1, "ann", 1), (2, "bob", 2)), TargetBatch(7))
        target.repair(rows((1, "ana", 20), (2, "bob", 20, True)), 20)
        assert self.names(target, 1, 2) == {"1": "ana"}
        assert target.checkpoint() == 7

    def test_drop_removes_the_generation_storage(self, case: TargetCase,
                                                 target: GenerationTarget) -> None:
        target.write(rows((1, "ann", 1)), TargetBatch(0))
        target.close()
        target.drop()
        again = case.target.open(target.location, target.context)
        try:
            assert again.checkpoint() is None and again.stored_keys() == []
        finally:
            again.close()

    def test_retired_generations_are_dropped_by_kind(self, case: TargetCase,
                                                     target: GenerationTarget) -> None:
        target.write(rows((1, "ann", 1)), TargetBatch(0))
        target.close()
        drop_generation_storage({case.target.kind: target.location}, target.context)
        assert case.target.open(target.location, target.context).stored_keys() == []

    # ------------------------------------------------------------------ bad input

    def test_rows_without_the_key_are_refused(self, target: GenerationTarget) -> None:
        with pytest.raises(TargetError):
            target.write(rows((1, "ann", 1)).drop_columns(["id"]), TargetBatch(0))
        with pytest.raises(TargetError, match="at least one truncate"):
            target.truncate(TargetBatch(1))

    def test_outputs_and_folds_are_checked_against_the_key(self, case: TargetCase) -> None:
        projection = Projection(name="v", sources=(changelog("t"),), target=case.target,
                                options=ProjectionOptions(), transform=lambda frame: frame)
        case.target.check_output(projection, list(TYPES), TYPES, stateful=False)
        with pytest.raises(MissingKeyError):
            case.target.check_output(projection, [c for c in TYPES if c != "id"], TYPES,
                                     stateful=False)
        case.target.check_fold_key("v", "id")
        with pytest.raises(MissingKeyError):
            case.target.check_fold_key("v", "name")
        assert isinstance(case.target, Target)
