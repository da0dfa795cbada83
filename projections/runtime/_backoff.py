"""How long a projection or view that failed with an error retrying can fix waits before it
tries again: 1 s, doubling with each failure in a row, up to ``BACKOFF_MAX`` s. The count of a
projection restarts when a batch gets through."""

from __future__ import annotations

#: The longest wait between two tries, in seconds.
BACKOFF_MAX = 60.0


def retry_delay(failures: int) -> float:
    """Seconds to wait after the ``failures``-th failure in a row (1, 2, 4, … ``BACKOFF_MAX``)."""
    return min(BACKOFF_MAX, 2.0 ** max(0, failures - 1))
