"""A runner running in a thread while a bench measures beside it (rebuild, windows)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from lakefold._bench.report import BenchmarkError


class BackgroundRunner:
    """``runner.run`` in a thread until ``close``; its failure is re-raised by ``wait`` and
    ``check`` (a BenchmarkError)."""

    def __init__(self, runner: Any) -> None:
        self.stop = threading.Event()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(runner,), daemon=True)
        self.thread.start()

    def _run(self, runner: Any) -> None:
        try:
            runner.run(stop=self.stop)
        except BaseException as e:  # re-raised by wait and check
            self.failure = e

    def check(self, what: str) -> None:
        """Raise if the runner stopped (``what``: what it stopped before)."""
        if not self.thread.is_alive():
            raise BenchmarkError(f"the runner stopped {what}") from self.failure

    def wait(self, done: Callable[[], bool], what: str) -> None:
        while not done():
            self.check(f"before {what}")
            time.sleep(0.05)

    def close(self, timeout: float | None = None) -> None:
        self.stop.set()
        self.thread.join(timeout=timeout)
