"""Operations: running a capture and looking after it.

Inside: ``Capture`` (set-up, the capture loop, reconnects; ``_capture``), its side thread
(heartbeats, pause and resume, unfinished snapshots, the publication; ``_control``), slot
health (``_slot_health``) and recovery after an invalidated slot (``_recovery``), one live
capture per slot (``_slot_ownership``), recoverable slot creation (``_slot_intent``), the
publication guard in the source (``_publication_guard``), the checks and set-up of the source
database (``_source_setup``) and which source a slot and a stream prefix belong to when several
sources share a store (``_sources``).
"""

from lakefold.capture.operations._capture import Capture, CaptureStats, drop_capture
from lakefold.capture.operations._control import pause as pause_capture, resume as resume_capture
from lakefold.capture.operations._recovery import recover
from lakefold.capture.operations._slot_health import SlotHealth, SlotInvalidatedError, slot_health

__all__ = [
    "Capture",
    "CaptureStats",
    "SlotHealth",
    "SlotInvalidatedError",
    "drop_capture",
    "pause_capture",
    "recover",
    "resume_capture",
    "slot_health",
]
