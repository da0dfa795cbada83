"""Session windows: the events of one key (a user, a device) whose times are less than a gap
apart form a session, from its first event's time to its last event's time plus the gap (as in
Spark's ``session_window`` and Flink's session windows).

A session changes as events come: an event within the gap of a session extends it, one
between two sessions merges them. The windowed input's feed therefore *moves* rows: the rows of
the events of merged or extended sessions are deleted under their old ``window_start`` and
written under the new one, so the view recomputes the old session's partition (its row goes)
and the new one's.

**Lateness**, by the log as for fixed windows (``_windows``): the watermark before an event is
the largest event time before it in commit order (itself included) minus the allowed lateness;
a session is *closed* once the watermark reached its end. An event is late when it would
change a closed session (its time is within the gap of one) or, touching no session, would be
a session closed already (its time plus the gap is at or below the watermark): closed sessions
stay as they were written, final. An event within the gap of an open session joins it (and may
move its start back), however far behind the watermark the event alone is. A late event is
listed (``lakefold late list``); it cannot be replayed, because folding it in would merge
sessions already final.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class _Session:
    start: int
    last: int
    #: The batch's events in it (indexes into the batch).
    new: set[int] = field(default_factory=set)
    #: Events fed before: position → the (start, end) its row was written with.
    old: dict[int, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Sessions:
    """What a batch of events does to the sessions of their keys."""

    #: (batch index, session start, session end) of every event fed on time.
    new_rows: list[tuple[int, int, int]]
    #: (position, old start, new start, new end) of every earlier event whose session moved.
    moved: list[tuple[int, int, int, int]]
    #: (batch index, the watermark it came behind, start and end of the session it hit).
    late: list[tuple[int, int, int, int]]
    #: The largest event time after the batch.
    max_time: int | None


def _islands(gap: int, items: list[tuple[int, int | None, tuple[int, int] | None]]
             ) -> list[_Session]:
    """The sessions of one key's earlier events ``(time, position, (start, end) of its row)``
    (a deleted event's time has neither): its times less than a gap apart, as they formed
    (every event fed was on time, so the sessions are the islands of their times)."""
    out: list[_Session] = []
    for at, position, row in sorted(items, key=lambda i: i[0]):
        if not out or at - out[-1].last >= gap:
            out.append(_Session(at, at))
        out[-1].last = max(out[-1].last, at)
        if position is not None and row is not None:
            out[-1].old[position] = row
    return out


def assign_sessions(gap: int, lateness: int, keys: Sequence[Hashable], times: np.ndarray,
                    missing: np.ndarray, earlier: Sequence[tuple[Hashable, int, int, int, int]],
                    max_before: int | None,
                    deleted: Sequence[tuple[Hashable, int]] = (),
                    phantom: np.ndarray | None = None) -> Sessions:
    """Sessions after the batch's events (in commit order; ``keys``, ``times`` in
    microseconds, ``missing``: no time; ``phantom``: events deleted since, which shape the
    sessions and move the watermark but have no row) given the ``earlier`` fed rows of their
    keys as ``(key, position, time, window start, window end)`` and the ``deleted`` earlier
    events of those keys as ``(key, time)`` (see the module docstring and
    ``_deleted_events``)."""
    grouped: dict[Hashable, list[tuple[int, int | None, tuple[int, int] | None]]] = {}
    for key, position, at, start, end in earlier:
        grouped.setdefault(key, []).append((at, position, (start, end)))
    for key, at in deleted:
        grouped.setdefault(key, []).append((at, None, None))
    sessions = {key: _islands(gap, items) for key, items in grouped.items()}
    shadow = np.zeros(len(keys), dtype=bool) if phantom is None else phantom
    top = max_before
    late = []
    for index, (key, at, gone, ghost) in enumerate(zip(
            keys, times.tolist(), missing.tolist(), shadow.tolist(), strict=True)):
        if gone:
            continue
        top = at if top is None else max(top, at)
        watermark = top - lateness
        found = sessions.setdefault(key, [])
        touching = [s for s in found if at < s.last + gap and at + gap > s.start]
        closed = [s for s in touching if s.last + gap <= watermark]
        # Late only for a session already closed: one it would join, or (touching none) the
        # one it would be on its own. An event within the gap of an open session joins it
        # however far behind the watermark the event alone is.
        if closed or (not touching and at + gap <= watermark):
            if not ghost:  # a deleted event the live run found late was never recorded
                hit = closed[0] if closed else _Session(at, at)
                late.append((index, watermark, hit.start, hit.last + gap))
            continue
        merged = _Session(min([at, *(s.start for s in touching)]),
                          max([at, *(s.last for s in touching)]),
                          ({index} if not ghost else set()).union(*(s.new for s in touching)),
                          {k: v for s in touching for k, v in s.old.items()})
        sessions[key] = [s for s in found if s not in touching] + [merged]
    new_rows, moved = [], []
    for found in sessions.values():
        for session in found:
            end = session.last + gap
            new_rows += [(index, session.start, end) for index in session.new]
            moved += [(position, was[0], session.start, end)
                      for position, was in session.old.items() if was != (session.start, end)]
    return Sessions(sorted(new_rows), sorted(moved), late, top)
