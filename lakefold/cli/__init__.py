"""The ``lakefold`` command line (typer + rich): the entry point and one module per command group.

What it owns: how a command reads its arguments and settings, calls the packages below, and
prints (tables, progress bars, ``--json``, errors as one line with a non-zero exit code).

- ``_main``: the entry point (``main``, the console script), the help's style, stderr logging.
- ``_common``: the root typer ``app`` every group adds its commands to; shared printing.
- one module per command group: ``_demo`` (demo), ``_projections`` (run, rebuild, pause,
  resume, status, dlq, search), ``_late`` (late list, replay), ``_spark`` (query, optimize,
  vacuum), ``_capture`` (capture run, streams, read, tail, compact, drop), ``_snapshots``
  (capture resnapshot, status, pause, resume, recover), ``_events`` (events install, status,
  tail), ``_console`` (console); ``lakefold bench`` is ``lakefold._bench``'s.

What it may import: everything below it: the packages (``lakefold.capture``,
``lakefold.eventstore``, ``lakefold.projections``, ``lakefold.spark``, ``lakefold.schemas``,
``lakefold.core``), the application's services (``lakefold.settings``,
``lakefold._from_settings``, ``lakefold.local``, ``lakefold.console``, ``lakefold._bench``) and
the demo (``lakefold.demo``). It sits at the top: nothing in lakefold imports it
(tests/lakefold/test_layers.py fails the suite on such an import). A command holds no domain
logic: what it does is a call to a package.
"""

from __future__ import annotations

from lakefold.cli._main import app, command, main, tidy_help

__all__ = ["app", "command", "main", "tidy_help"]
