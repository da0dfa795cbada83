"""Windowed views for the SIGKILL loop (``kill_child``): page views per minute (late events
listed) and the per-minute totals over them (``test_view_crash.py``)."""

from __future__ import annotations

from tests.projections.window_oracle import define

define(("per_minute",))
