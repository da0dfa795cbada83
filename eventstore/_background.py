"""``WakeableThread``: a daemon thread started on the first ``poke`` and woken by each one.

The sequencer and the sealer both run this way: writers poke without ever blocking, a burst of
pokes costs one wake-up, and ``close`` stops the thread after the work in progress.
"""

from __future__ import annotations

import threading


class WakeableThread:
    """Subclasses implement ``_run``: loop until ``self._stop`` is set, waiting on
    ``self._wake`` (and clearing it) between rounds of work."""

    def __init__(self, name: str, *, join_timeout_s: float) -> None:
        self._name = name
        self._join_timeout = join_timeout_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def poke(self) -> None:
        """Ask for a round of work soon; never blocks."""
        if self._thread is None:
            with self._start_lock:
                if self._thread is None and not self._stop.is_set():
                    self._thread = threading.Thread(target=self._run, daemon=True,
                                                    name=self._name)
                    self._thread.start()
        self._wake.set()

    def close(self) -> None:
        """Stop the thread, after the round in progress."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=self._join_timeout)

    def _run(self) -> None:
        raise NotImplementedError
