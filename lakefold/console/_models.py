"""What the console's API takes and answers, as pydantic models: ``/openapi.json`` is made
from them, and every JSON answer is checked against its model before it leaves (the overview
excepted: its JSON is encoded once per reading, and tests/console check it against
``Overview``).

Answers forbid fields they do not declare: a field added to a reading without its model fails
loudly (500, and the tests) instead of vanishing from the answer. Values a user's data decides
(a record's columns, an event's payload, a view's rows) are JSON objects of any shape. Times
are ISO 8601 text.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

#: No name in lakefold holds a NUL byte (PostgreSQL text cannot): the document says so, and
#: the gate (``_guard``) answers 400 to a path or query that holds one.
NO_NUL = r"^[^\x00]*$"

Text = Annotated[str, StringConstraints(pattern=NO_NUL)]
#: A time as ISO 8601 text (what ``datetime.isoformat`` writes).
IsoTime = Annotated[str, Field(description="ISO 8601 time")]
Health = Literal["ok", "warning", "failed"]
Row = Annotated[dict[str, Any], Field(description="A row: column name → JSON value (times "
                                                  "as ISO text, decimals as text, bytes as "
                                                  "hex)")]


class Answer(BaseModel):
    """A JSON answer of the API: only the fields it declares."""

    model_config = ConfigDict(extra="forbid")


# ------------------------------------------------------------------ requests and actions

class ErrorBody(Answer):
    """An error: what was wrong and what to do, and a stable code."""

    error: str
    code: str


class Resnapshot(BaseModel):
    """Tables (``schema.table``) of the capture to read again."""

    tables: list[Text] = Field(min_length=1)


class ActionResult(Answer):
    """What an action did (``changed`` false: it already was so) and its audit row."""

    action: str
    subject: str
    changed: bool
    message: str
    audit_id: int
    detail: dict[str, Any]


# ------------------------------------------------------------------ the console itself

class ConsoleInfo(Answer):
    """What this console is: whether it needs a token (the page offers 'log out'), whether it
    can rebuild (it was given the projections module)."""

    token_required: bool
    can_rebuild: bool


# ------------------------------------------------------------------ the overview

class SnapshotRun(Answer):
    """A running snapshot of a capture: tables done of all, rows copied so far."""

    snapshot_id: int
    kind: str
    tables_done: int
    tables: int
    rows: int
    last_error: str | None


class CaptureState(Answer):
    """One capture slot that has streams in the store, with its health."""

    slot: str
    source: str = Field(description="where the capture reads: host:port/database (never a "
                                    "role or password), or the database's name")
    stream_prefix: str | None = Field(description="the prefix of its stream names (null: "
                                                  "not recorded yet)")
    status: str = Field(description="ok, warning, critical, lost or missing; unknown for "
                                    "a capture of another source than the console's")
    active: bool
    paused: bool
    wal_status: str | None
    safe_wal_size: int | None
    lag_bytes: int | None
    lag_seconds: float | None
    retained_bytes: int | None
    records: int
    changes_per_s: float
    snapshots: list[SnapshotRun]
    last_error: str | None
    problems: list[str]
    streams: list[str]


class Subscription(Answer):
    """A durable subscription of the event store and its lag behind the head."""

    name: str
    position: int
    lag: int
    updated_at: IsoTime | None


class WatermarkHolder(Answer):
    """The transaction holding the event store's visibility watermark (never its statement)."""

    pid: int | None
    application: str | None
    state: str | None
    xact_start: IsoTime | None
    held_for_s: float
    prepared: bool


class EventStoreState(Answer):
    """The event store: its head, rate, the watermark's holder, the subscriptions."""

    head: int
    events_per_s: float
    pending_events: int
    watermark_held: bool
    watermark_holder: WatermarkHolder | None
    subscriptions: list[Subscription]


class SourceState(Answer):
    """One input of a projection: the last position processed, the head, the lag."""

    source: str
    position: int
    head: int
    lag_records: int
    lag_seconds: float


class Input(Answer):
    """What a projection or view reads."""

    kind: Literal["changelog", "events", "view"]
    name: str


class ProjectionState(Answer):
    """A projection or view as ``lakefold status`` shows it, with its inputs, target and
    health."""

    name: str
    target: str
    generation: int
    state: str = Field(description="idle, running, rebuilding, paused, resuming, stopped, "
                                   "retrying or failed")
    paused: bool
    position: dict[str, int]
    lag_records: int
    lag_seconds: float
    throughput_per_s: float
    last_batch_at: IsoTime | None
    last_error: str | None
    dead_letters: int
    rebuilding_generation: int | None
    rebuild_position: dict[str, int]
    sources: list[SourceState]
    holds_compaction: dict[str, int]
    style: Literal["projection", "view"]
    late_events: int
    watermark: IsoTime | None
    records_total: int
    dead_letters_total: int
    inputs: list[Input]
    target_spec: str
    key: list[str] | None
    health: Health
    errors_total: int


class Batch(Answer):
    """One committed batch of a projection or view."""

    generation: int
    batch_id: int
    committed_at: IsoTime
    rows: int = Field(description="records it applied, on the scale of the lag")
    end_position: dict[str, int] = Field(
        description="per input, the first position not yet applied after it")


class DagNode(Answer):
    """A node of the DAG, in a column counted from the captures."""

    id: str
    kind: Literal["capture", "changelog", "events", "projection", "view", "target"]
    label: str
    health: Health
    column: int


class DagEdge(Answer):
    """An edge of the DAG: data flows ``from`` → ``to`` (node ids)."""

    from_: str = Field(alias="from")
    to: str


class Dag(Answer):
    """Captures and event categories → changelog streams → projections → views → targets."""

    nodes: list[DagNode]
    edges: list[DagEdge]


class Overview(Answer):
    """The whole system, as read at ``read_at``."""

    read_at: IsoTime
    captures: list[CaptureState]
    event_store: EventStoreState
    projections: list[ProjectionState]
    dag: Dag


#: A sample: ``[ISO 8601 time, value]``. (An array of two, not ``prefixItems``: OpenAPI tools
#: that read the document as JSON Schema draft 4, schemathesis among them, refuse those.)
Point = Annotated[list[str | float], Field(min_length=2, max_length=2,
                                           description="[ISO 8601 time, value]")]


class History(Answer):
    """Sampled lag and throughput: subject → metric → ``[time, value]`` points in time order.
    Subjects are ``projection:NAME``, ``capture:SLOT`` and ``eventstore``."""

    minutes: float
    series: dict[str, dict[str, list[Point]]]


# ------------------------------------------------------------------ contents

class StreamInfo(Answer):
    """A changelog stream: its name, where it comes from, its head and schema version."""

    name: str
    stream_id: int
    slot: str
    database: str
    schema_: str = Field(alias="schema")
    table: str
    head: int
    schema_version: int
    last_commit_ts: IsoTime | None
    source: str = Field(description="the source of its capture, host:port/database (empty "
                                    "for a view's output stream)")


class StreamRecords(Answer):
    """Records of a changelog stream, newest first; ``next_before`` pages on (None: no more)."""

    stream: str
    head: int
    schema_version: int
    records: list[Row]
    next_before: int | None


class EventEntry(Answer):
    """A stored event."""

    position: int
    stream_id: str
    stream_version: int
    type: str
    schema_version: int
    event_id: str
    recorded_at: IsoTime
    data: dict[str, Any]


class CategoryEvents(Answer):
    """Events of a category, newest first; ``next_before`` pages on (None: no more)."""

    category: str
    head: int
    events: list[EventEntry]
    next_before: int | None


class DeadLetter(Answer):
    """A record that failed every retry: where it came from, the last error, its status."""

    id: int
    name: str
    generation: int
    ref: str
    stage: str
    source: str
    position: int
    record: dict[str, Any]
    error: str
    attempts: int
    status: Literal["open", "retry", "resolved", "dropped"]
    retry_seq: int | None
    created_at: IsoTime
    updated_at: IsoTime


class ViewRows(Answer):
    """A view's rows for one key, from its current generation's target."""

    name: str
    generation: int
    key_columns: list[str]
    key: list[str]
    rows: list[Row]


class AuditEntry(Answer):
    """An action taken from the console: who, what, on what, when, how it ended."""

    id: int
    at: IsoTime
    who: str
    action: str
    subject: str
    detail: dict[str, Any]
    outcome: str
