"""A capture process to be killed: ``python -m tests.capture.capture_victim DSN STREAMING``.

Runs the capture of tables ``a`` and ``b`` (slot ``crash``) until it is killed. Small batches,
so that a large transaction spans many store transactions.
"""

from __future__ import annotations

import sys

from lakefold.capture import Capture, CaptureConfig


def config(dsn: str, *, streaming: bool) -> CaptureConfig:
    return CaptureConfig(source_dsn=dsn, tables=("a", "b"), slot="crash", publication="crash",
                         streaming=streaming, batch_rows=2_000)


def main() -> None:
    dsn, streaming = sys.argv[1], sys.argv[2] == "1"
    Capture(config(dsn, streaming=streaming)).run()


if __name__ == "__main__":
    main()
