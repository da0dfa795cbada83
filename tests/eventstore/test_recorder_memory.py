"""The recorder contract, run against the in-memory recorder."""

from __future__ import annotations

from lakefold.eventstore import EventStore, InMemoryRecorder
from lakefold.schemas import EventRegistry
from tests.eventstore.recorder_contract import RecorderContract


class TestInMemoryRecorder(RecorderContract):
    def make_store(self, registry: EventRegistry | None = None) -> EventStore:
        return EventStore.from_recorder(InMemoryRecorder(), registry=registry)
