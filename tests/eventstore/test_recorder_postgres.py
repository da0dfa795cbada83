"""The recorder contract, run against the PostgreSQL recorder (a fresh database per test)."""

from __future__ import annotations

import pytest

from lakefold.eventstore import EventStore
from lakefold.schemas import EventRegistry
from tests.eventstore.recorder_contract import RecorderContract
from tests.fixtures.postgres import TestDatabase


class TestPostgresRecorder(RecorderContract):
    dsn: str

    @pytest.fixture(autouse=True)
    def _database(self, pg: TestDatabase) -> None:
        self.dsn = pg.dsn
        with EventStore(pg.dsn) as store:
            store.install()

    def make_store(self, registry: EventRegistry | None = None) -> EventStore:
        return EventStore(self.dsn, registry=registry)
