"""A capture process to be killed during its snapshot:
``python -m tests.capture.snapshot_victim DSN``. Captures table ``items`` (slot ``snapkill``)
with small snapshot chunks until killed."""

from __future__ import annotations

import sys
from datetime import timedelta

from lakefold.capture import Capture, CaptureConfig, HeartbeatPolicy, SnapshotPolicy


def config(dsn: str) -> CaptureConfig:
    return CaptureConfig(source_dsn=dsn, tables=("items",), slot="snapkill",
                         publication="snapkill", batch_rows=2_000,
                         snapshot=SnapshotPolicy(chunk_rows=400, incremental_chunk_rows=300),
                         heartbeat=HeartbeatPolicy(interval=timedelta(seconds=1)))


def main() -> None:
    Capture(config(sys.argv[1])).run()


if __name__ == "__main__":
    main()
