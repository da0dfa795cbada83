"""A capture that SIGKILLs itself at one point of its slot's creation:
``python -m tests.capture.creation_victim DSN SLOT POINT``.

It captures table ``t`` through slot and publication ``SLOT`` into streams prefixed
``SLOT:``. ``POINT`` is where it dies (test-only fault injection: the real functions are
wrapped in this child process only):

``before-create``  just before CREATE_REPLICATION_SLOT;
``after-create``   right after the slot exists on the source, before the store knows it;
``after-plan``     after the initial snapshot was planned in the store, before the slot is
                   registered;
``before-copy``    after the slot is registered, before a row of the snapshot was copied.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from lakefold.capture import Capture, CaptureConfig
from lakefold.capture.decoding._replication_connection import ReplicationConnection
from lakefold.capture.snapshots import _initial_snapshot

POINTS = ("before-create", "after-create", "after-plan", "before-copy")


def config(dsn: str, slot: str) -> CaptureConfig:
    return CaptureConfig(source_dsn=dsn, tables=("t",), slot=slot, publication=slot,
                         stream_prefix=f"{slot}:")


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(point: str) -> None:
    """Wrap the function at ``point`` so that the process dies there."""
    if point in ("before-create", "after-create"):
        create_slot = ReplicationConnection.create_slot

        def dying_create_slot(self: ReplicationConnection, name: str, *,
                              snapshot: str = "nothing") -> Any:
            if point == "before-create":
                _die()
            create_slot(self, name, snapshot=snapshot)
            _die()

        setattr(ReplicationConnection, "create_slot", dying_create_slot)  # noqa: B010
    elif point == "after-plan":
        plan_initial = _initial_snapshot.plan_initial

        def dying_plan_initial(*args: Any, **kwargs: Any) -> Any:
            plan_initial(*args, **kwargs)
            _die()

        setattr(_initial_snapshot, "plan_initial", dying_plan_initial)  # noqa: B010
    elif point == "before-copy":
        setattr(_initial_snapshot, "copy_exported", lambda *args, **kwargs: _die())  # noqa: B010
    else:
        raise SystemExit(f"unknown point {point!r}; use one of {', '.join(POINTS)}")


def main() -> None:
    dsn, slot, point = sys.argv[1:4]
    arm(point)
    Capture(config(dsn, slot)).run()


if __name__ == "__main__":
    main()
