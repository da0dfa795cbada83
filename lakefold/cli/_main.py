"""The entry point of the ``lakefold`` command: ``main`` runs the typer app (``_common.app``)
with every command group registered and its help tidied; a lakefold error prints one line
saying what to fix (exit code 1)."""

from __future__ import annotations

import logging
import sys
from typing import Any

import typer
import typer.main
from rich.console import Console
from rich.markup import escape

from lakefold._bench import bench_app
from lakefold.cli._common import app
from lakefold.core.exceptions import LakefoldError

__all__ = ["app", "command", "main", "tidy_help"]

app.add_typer(bench_app, name="bench")
_stderr = Console(stderr=True)


class _StderrLines(logging.Handler):
    """lakefold's warnings and errors on stderr, one ``warning: ...`` line each, as the CLI's
    own errors are printed."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            style = "bold red" if record.levelno >= logging.ERROR else "yellow"
            _stderr.print(f"[{style}]{record.levelname.lower()}:[/] {escape(self.format(record))}",
                          highlight=False, soft_wrap=True)
        except Exception:
            self.handleError(record)


def _log_to_stderr() -> None:
    """Route the ``lakefold`` loggers' warnings and errors to stderr (once)."""
    logger = logging.getLogger("lakefold")
    if not any(isinstance(h, _StderrLines) for h in logger.handlers):
        # WARNING until a command loads its settings, which set LAKEFOLD_LOG_LEVEL's level.
        logger.setLevel(logging.WARNING)
        logger.addHandler(_StderrLines())


def _with_driver_log(message: str) -> str:
    """``message``, plus where the Spark driver's own output went when this command started
    one (its details are there, not on the terminal)."""
    session = sys.modules.get("lakefold.spark._session")
    path = session.driver_log() if session is not None else None
    if path is None:
        return message
    # After a multi-line message (a SQL error shows the statement), on a line of its own.
    return f"{message}{chr(10) if chr(10) in message else ' '}(Spark's own log: {path})"


_METAVARS = {"str": "TEXT", "int": "INTEGER", "float": "NUMBER", "int range": "INTEGER",
             "float range": "NUMBER", "path": "PATH", "file": "FILE", "directory": "DIR"}


def _metavar(param: Any, ctx: typer.Context) -> str:
    """One upper-case placeholder in click's style for an option's value (``TEXT``,
    ``INTEGER``, ``[a|b]``), whatever typer would print (``<list[str]>``)."""
    shown = str(getattr(param, "display_type", lambda _: "")(ctx) or "").strip("<>")
    while shown.startswith("list[") and shown.endswith("]"):
        shown = shown[5:-1]
    if "|" in shown:
        return f"[{shown}]"
    return _METAVARS.get(shown, shown.upper() or "TEXT")


def tidy_help(command: Any, ctx: typer.Context | None = None) -> Any:
    """``command`` (and its subcommands) with help in one style: arguments as upper-case
    names in the usage line (``STREAM TYPE``, not ``{stream} {TYPE}``), options' values as
    click's placeholders, no type after a flag."""
    # typer's commands and parameters are its own (vendored) click's: known by what they say
    # they are, not by class
    ctx = ctx or typer.Context(command)
    for param in command.params:
        if param.param_type_name == "argument":
            param.metavar = param.metavar or (param.name or "value").upper()
            # its name says what it is; typer would add "<list[int]>"
            param.display_type_rich = lambda ctx: None
        elif param.param_type_name == "option" and param.metavar is None \
                and not getattr(param, "is_flag", False):
            param.metavar = _metavar(param, ctx)
    for sub in getattr(command, "commands", {}).values():
        tidy_help(sub, ctx)
    return command


def command() -> Any:
    """The ``lakefold`` command as click runs it (the typer app, help tidied)."""
    return tidy_help(typer.main.get_command(app))


def main() -> None:
    """Entry point: run the CLI, turning lakefold errors into a one-line message."""
    _log_to_stderr()
    if sys.argv[1:2] == ["bench"]:  # the benchmarks' imports are heavy: only when asked for
        from lakefold._bench import register_benchmarks

        register_benchmarks()
    try:
        command()(prog_name="lakefold")
    except LakefoldError as e:
        _stderr.print(f"[bold red]error:[/] {escape(_with_driver_log(str(e)))}",
                      highlight=False, soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        _stderr.print("interrupted")
        sys.exit(130)


# Command groups live in their own modules and add themselves to `app` (from _common) when
# imported: here, `demo` first, so that the order of the help stays the same.
# isort: off
from lakefold.cli import _demo  # noqa: E402, F401  (demo)
from lakefold.cli import (  # noqa: E402
    _capture,  # noqa: F401  (capture run, streams, read, tail, compact, drop)
    _console,  # noqa: F401  (console)
    _events,  # noqa: F401  (events install, status, tail)
    _late,  # noqa: F401  (late list, replay)
    _projections,  # noqa: F401  (run, rebuild, pause, resume, status, dlq, search)
    _snapshots,  # noqa: F401  (capture resnapshot, status, pause, resume, recover)
    _spark,  # noqa: F401  (query, optimize, vacuum)
)
# isort: on
