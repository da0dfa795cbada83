"""The event recorder port, for code that implements or drives a recorder below
``EventStore``: the ``EventRecorder`` protocol and the values that cross it (log and stream
queries, sealed ranges, the watermark holder, waiters). Applications use ``EventStore``."""

from __future__ import annotations

from lakefold.eventstore._model import LogQuery, Sealed, StreamQuery, WatermarkHolder
from lakefold.eventstore._recorder import EventRecorder, Waiter

__all__ = ["EventRecorder", "LogQuery", "Sealed", "StreamQuery", "Waiter", "WatermarkHolder"]
