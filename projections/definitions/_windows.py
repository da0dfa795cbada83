"""Windows over event time: which windows an event belongs to, and when it is too late.

A windowed view names one input's timestamp column (``tumbling("orders.occurred_at",
"1 minute")``); lakefold gives that input's rows the columns ``window_start`` and
``window_end``, one row per window an event belongs to (one for a tumbling window, ``size /
slide`` for a hopping one), so the query groups by ``window_start`` like any column, and the
window is a partition of the view (``_view_plan``): a change recomputes only its windows.

**Lateness is decided by the log, not by the clock or the batch.** The watermark before an
event is the largest event time of the input's events *before it in commit order* minus the
allowed lateness; a window whose end is at or below that watermark is *closed* for the event,
which is then late for it. A window's row is *final* once the watermark passed its end. Since
the order is the log's, a rebuild classifies every event exactly as the live run did, however
the events were batched: Spark drops late rows by the watermark of the micro-batch they
happen to land in, Flink by when they arrive.

Windows are aligned to the epoch in UTC (as in Spark and Flink): a 1-minute window starts at a
whole minute. A timestamp without a time zone is read as UTC.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakefold.projections.exceptions import ProjectionDefinitionError

#: The columns a windowed input gains, and the column a windowed view's output gains.
WINDOW_START: Final = "window_start"
WINDOW_END: Final = "window_end"
WINDOW_FINAL: Final = "window_final"
_MICROS: Final = {"us": 1, "ms": 1_000, "s": 1_000_000, "m": 60_000_000,
                  "h": 3_600_000_000, "d": 86_400_000_000}
_UNITS: Final = {
    "us": "us", "microsecond": "us", "microseconds": "us",
    "ms": "ms", "millisecond": "ms", "milliseconds": "ms",
    "s": "s", "sec": "s", "secs": "s", "second": "s", "seconds": "s",
    "m": "m", "min": "m", "mins": "m", "minute": "m", "minutes": "m",
    "h": "h", "hr": "h", "hour": "h", "hours": "h",
    "d": "d", "day": "d", "days": "d",
}
_PART: Final = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*")
TIME_TYPE: Final = pa.timestamp("us", tz="UTC")


def duration(what: str, value: object, *, zero: bool = False) -> timedelta:
    """A duration from a ``timedelta`` or text such as ``"1 minute"``, ``"90s"`` or
    ``"1h 30m"``; zero only where ``zero`` allows it, never negative."""
    if isinstance(value, timedelta):
        found = value
    elif isinstance(value, str) and value.strip():
        text, total, at = value.strip().lower(), 0.0, 0
        sign = -1 if text.startswith("-") else 1
        text = text.lstrip("-")
        while at < len(text):
            match = _PART.match(text, at)
            if match is None or match.group(2) not in _UNITS:
                raise ProjectionDefinitionError(
                    f"{what} {value!r} is not a duration; write it as '1 minute', '90s', "
                    "'1h 30m' or a datetime.timedelta (units: ms, s, m/min, h, d)")
            total += float(match.group(1)) * _MICROS[_UNITS[match.group(2)]]
            at = match.end()
        found = timedelta(microseconds=sign * round(total))
    else:
        raise ProjectionDefinitionError(
            f"{what} {value!r} is not a duration; write it as '1 minute', '90s' or a "
            "datetime.timedelta (a bare number has no unit)")
    if found < timedelta(0) or (found == timedelta(0) and not zero):
        raise ProjectionDefinitionError(
            f"{what} {value!r} must be {'zero or ' if zero else ''}positive")
    return found


def micros(value: timedelta) -> int:
    return (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds


def moment(micros_since_epoch: int) -> datetime:
    """The UTC time ``micros_since_epoch`` microseconds after the epoch."""
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros_since_epoch)


@dataclass(frozen=True)
class Window:
    """A window over one input's timestamp column (see the module docstring)."""

    kind: str  # "tumbling", "hopping" or "session" (``_session_windows``)
    input: str
    time: str
    size: timedelta
    slide: timedelta
    lateness: timedelta
    #: "updates": a window's row is written as it changes, with ``window_final``;
    #: "final": only once its window is final (emit on window close).
    emit: str = "updates"
    #: Of a session window: the input's columns a session is of (the gap is ``size``).
    by: tuple[str, ...] = ()

    @property
    def size_us(self) -> int:
        return micros(self.size)

    @property
    def slide_us(self) -> int:
        return micros(self.slide)

    @property
    def lateness_us(self) -> int:
        return micros(self.lateness)

    def describe(self) -> dict[str, object]:
        return {"kind": self.kind, "input": self.input, "time": self.time,
                "size": self.size.total_seconds(), "slide": self.slide.total_seconds(),
                "lateness": self.lateness.total_seconds(), "emit": self.emit} \
            | ({"by": list(self.by)} if self.by else {})

    def assign(self, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For event times (int64 microseconds since the epoch), every (event index, window
        start) pair: an event is in each window ``[start, start + size)`` that holds it."""
        slide, size = self.slide_us, self.size_us
        last = np.floor_divide(times, slide) * slide  # the latest window start <= t
        rows, starts = [], []
        for back in range(-(-size // slide)):
            start = last - back * slide
            holds = start + size > times
            rows.append(np.nonzero(holds)[0])
            starts.append(start[holds])
        order = np.argsort(np.concatenate(rows), kind="stable")
        return np.concatenate(rows)[order], np.concatenate(starts)[order]


def _window(kind: str, on: object, size: object, slide: object, lateness: object,
            emit: object) -> Window:
    if not isinstance(on, str) or on.count(".") != 1 or not all(on.split(".")):
        raise ProjectionDefinitionError(
            f"{kind}(on={on!r}): name the input and its timestamp column as 'input.column' "
            "(e.g. 'orders.occurred_at')")
    if emit not in ("updates", "final"):
        raise ProjectionDefinitionError(
            f"{kind}(emit={emit!r}): emit is 'updates' (a window's row as it changes, with "
            "window_final) or 'final' (only once the window is final)")
    alias, column = on.split(".")
    what = "gap" if kind == "session" else "size"
    checked_size = duration(f"{kind} window {what}", size)
    checked_slide = duration(f"{kind} window slide", slide)
    if checked_slide > checked_size:
        raise ProjectionDefinitionError(
            f"{kind} window: slide {slide!r} is longer than size {size!r}, which would skip "
            "events between windows; make the slide at most the size")
    if micros(checked_size) % micros(checked_slide):
        raise ProjectionDefinitionError(
            f"{kind} window: size {size!r} is not a whole number of slides {slide!r}; "
            "choose a slide that divides the size")
    return Window(kind, alias, column, checked_size, checked_slide,
                  duration(f"{kind} window allowed lateness", lateness, zero=True), str(emit))


def tumbling(on: str, size: str | timedelta, *, lateness: str | timedelta = "0s",
             emit: str = "updates") -> Window:
    """Windows of ``size`` one after another over ``on`` ('input.column'); an event is in
    one window. ``lateness``: how far behind the largest event time seen an event may be and
    still correct its window (see the module docstring)."""
    return _window("tumbling", on, size, size, lateness, emit)


def hopping(on: str, size: str | timedelta, slide: str | timedelta, *,
            lateness: str | timedelta = "0s", emit: str = "updates") -> Window:
    """Windows of ``size`` starting every ``slide`` (Spark's and Flink's sliding windows);
    an event is in ``size / slide`` of them."""
    return _window("hopping", on, size, slide, lateness, emit)


def session(on: str, gap: str | timedelta, *, by: str | Sequence[str],
            lateness: str | timedelta = "0s", emit: str = "updates") -> Window:
    """Session windows over ``on`` ('input.column'): per value of the input's ``by``
    columns, events less than ``gap`` apart share a session, from the first event's time to
    the last one's plus the gap (see ``_session_windows``)."""
    columns = [by] if isinstance(by, str) else list(by) if isinstance(by, Sequence) else []
    if not columns or not all(isinstance(c, str) and c for c in columns):
        raise ProjectionDefinitionError(
            f"session(by={by!r}): name the input's column(s) a session is of, e.g. "
            "by='user_id' (a session is per user, device, ...)")
    found = _window("session", on, gap, gap, lateness, emit)
    return Window(found.kind, found.input, found.time, found.size, found.slide,
                  found.lateness, found.emit, tuple(columns))


def event_times(values: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """A time column's values as int64 microseconds since the epoch (UTC), and a mask of the
    values that are not a time (NULL, or text that does not parse as one)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        values = pa.array([_parse(v) for v in values.to_pylist()], TIME_TYPE)
    elif pa.types.is_date(values.type):
        values = pc.cast(pc.cast(values, pa.timestamp("us")), TIME_TYPE)
    elif pa.types.is_timestamp(values.type):
        values = pc.cast(values, pa.timestamp("us", tz=values.type.tz or "UTC")) \
            .cast(TIME_TYPE)
    else:
        raise ProjectionDefinitionError(f"a column of type {values.type} is not a time")
    missing = pc.is_null(values).to_numpy(zero_copy_only=False)
    micros = pc.fill_null(values.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
    return micros.astype(np.int64), missing


def _parse(text: str | None) -> object:
    from datetime import UTC, datetime

    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def is_time_type(data_type: pa.DataType) -> bool:
    """True when a column of this type can hold an event time (text is parsed per value)."""
    return bool(pa.types.is_timestamp(data_type) or pa.types.is_date(data_type)
                or pa.types.is_string(data_type) or pa.types.is_large_string(data_type))


@dataclass(frozen=True)
class Classified:
    """Events split by their windows: the on-time (event index, window start) pairs, the late
    ones with the watermark each came behind, the events without a time, and the largest
    event time after them all."""

    rows: np.ndarray
    starts: np.ndarray
    late_rows: np.ndarray
    late_starts: np.ndarray
    late_watermarks: np.ndarray
    no_time: np.ndarray
    max_time: int | None


def classify(window: Window, times: np.ndarray, missing: np.ndarray,
             max_before: int | None, deleted_before: np.ndarray | None = None,
             deleted_top: int | None = None) -> Classified:
    """Split events (in commit order) into on-time and late window pairs (see the module
    docstring); ``max_before``: the largest event time of the input's earlier events;
    ``deleted_before``: per event, the largest time of the events deleted since that came
    before it in the batch's range, ``deleted_top`` the largest of them all
    (``_deleted_events``)."""
    valid = ~missing
    floor = np.iinfo(np.int64).min
    seen = np.where(valid, times, floor)
    if deleted_before is not None:
        seen = np.maximum(seen, deleted_before)
    running = np.maximum.accumulate(seen) if len(seen) else seen
    if max_before is not None:
        running = np.maximum(running, max_before)
    rows, starts = window.assign(times)
    keep = valid[rows]
    rows, starts = rows[keep], starts[keep]
    watermark = running[rows] - window.lateness_us
    # A window is closed for an event once the watermark reached its end.
    late = (starts + window.size_us <= watermark) & (running[rows] != floor)
    top = int(running[-1]) if len(running) and running[-1] != floor else max_before
    if deleted_top is not None:  # deleted events after the last event moved it too
        top = deleted_top if top is None else max(top, deleted_top)
    return Classified(rows[~late], starts[~late], rows[late], starts[late], watermark[late],
                      np.nonzero(missing)[0], top)
