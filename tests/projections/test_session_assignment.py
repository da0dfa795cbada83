"""Which session an event joins, and when it is late, event by event (``assign_sessions``):
the smallest sequences of issue 34, where an event inside an open session was listed late
because the event alone was behind the watermark."""

from __future__ import annotations

import datetime as dt
from collections.abc import Hashable, Sequence

import numpy as np

from lakefold.projections.operators._session_windows import Sessions, assign_sessions

MINUTE = 60_000_000
GAP, LATENESS = 3 * MINUTE, 2 * MINUTE


def _at(text: str) -> int:
    moment = dt.datetime.fromisoformat(f"2026-11-26T{text}+00:00")
    return int(moment.timestamp() * 1_000_000)


def _one_by_one(events: Sequence[tuple[str, str]]) -> tuple[dict[int, tuple[int, int]],
                                                             list[int]]:
    """Feed ``events`` (key, time) one per batch, as a live run that keeps up would: the
    session (start, end) of each event fed, by its index, and the indexes found late."""
    rows: dict[int, tuple[Hashable, int, int, int]] = {}  # index → key, time, start, end
    late: list[int] = []
    top: int | None = None
    for index, (key, text) in enumerate(events):
        earlier = [(k, i, t, s, e) for i, (k, t, s, e) in rows.items() if k == key]
        found: Sessions = assign_sessions(GAP, LATENESS, [key], np.array([_at(text)]),
                                          np.array([False]), earlier, top)
        top = found.max_time
        late += [index for _, _, _, _ in found.late]
        for _, start, end in found.new_rows:
            rows[index] = (key, _at(text), start, end)
        for position, _, start, end in found.moved:
            key_, at, _, _ = rows[position]
            rows[position] = (key_, at, start, end)
    return {i: (s, e) for i, (_, _, s, e) in rows.items()}, late


def test_an_event_inside_an_open_session_joins_it() -> None:
    # a@08:00:00, a@08:02:30, b@08:05:20 (watermark 08:03:20), a@08:00:01
    sessions, late = _one_by_one([("a", "08:00:00"), ("a", "08:02:30"), ("b", "08:05:20"),
                                  ("a", "08:00:01")])
    assert late == []
    assert {i: s for i, s in sessions.items() if i != 2} == {
        i: (_at("08:00:00"), _at("08:05:30")) for i in (0, 1, 3)}


def test_an_event_within_the_gap_before_an_open_session_moves_its_start() -> None:
    # a@08:20, b@08:24 (watermark 08:22), a@08:18:30: session a [08:18:30, 08:23), 2 events
    sessions, late = _one_by_one([("a", "08:20:00"), ("b", "08:24:00"), ("a", "08:18:30")])
    assert late == []
    assert sessions[0] == sessions[2] == (_at("08:18:30"), _at("08:23:00"))


def test_late_only_for_a_closed_session_or_a_session_closed_on_its_own() -> None:
    sessions, late = _one_by_one([
        ("a", "09:00:00"),   # a's session [09:00, 09:03)
        ("b", "09:10:00"),   # watermark 09:08: a's session is closed
        ("a", "09:02:00"),   # would change a closed session: late
        ("c", "09:01:00"),   # touches nothing, [09:01, 09:04) closed on its own: late
        ("b", "09:07:30"),   # within b's open session, alone behind the watermark: joins
    ])
    assert late == [2, 3]
    assert sessions[4] == sessions[1] == (_at("09:07:30"), _at("09:13:00"))


def test_the_same_sessions_whatever_the_batching() -> None:
    events = [("a", "10:00:00"), ("a", "10:02:00"), ("b", "10:09:00"), ("a", "10:01:00"),
              ("b", "10:08:00"), ("a", "10:04:30"), ("c", "10:20:00"), ("a", "10:06:00"),
              ("b", "10:10:30")]
    one_by_one, late = _one_by_one(events)
    whole = assign_sessions(GAP, LATENESS, [k for k, _ in events],
                            np.array([_at(t) for _, t in events]),
                            np.zeros(len(events), dtype=bool), [], None)
    assert sorted(i for i, _, _, _ in whole.late) == late
    assert {i: (s, e) for i, s, e in whole.new_rows} == one_by_one
