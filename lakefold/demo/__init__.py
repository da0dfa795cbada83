"""The demo (``lakefold demo``): a shop database and its order events, captured and projected
into every kind of target and view, shown, rebuilt, and checked against SQL on the source.

What it owns:

- ``_shop``: the shop workload (schema ``shop``: customers, products, orders; inserts, updates,
  deletes) and the same figures computed by SQL on the source, the demo's oracle;
- ``_events``: the shop's ``OrderPlaced`` domain events, appended to an event store;
- ``projections``: the demo shop's projections and views, written with
  ``lakefold.projections`` as a user writes them (``lakefold run --projections
  lakefold.demo.projections``);
- ``_views``: showing the views, changing the source live, rebuilding, checking each view;
- ``_run``: ``run_demo``, the whole demo from start to end.

What it may import: the packages (``lakefold.capture``, ``lakefold.eventstore``,
``lakefold.projections``, ``lakefold.spark``, ``lakefold.schemas``, ``lakefold.core``) and the
application's services (``lakefold.settings``, ``lakefold._from_settings``, ``lakefold.local``).
Only the CLI (``lakefold.cli``) imports it; nothing else in lakefold may
(tests/lakefold/test_layers.py fails the suite on such an import), and it never imports the CLI.

``import lakefold.demo`` is cheap: ``run_demo`` is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakefold.core.lazy import lazy_getattr

if TYPE_CHECKING:
    from lakefold.demo._run import run_demo

__all__ = ["run_demo"]

__getattr__ = lazy_getattr("lakefold.demo", {"run_demo": "lakefold.demo._run"})


def __dir__() -> list[str]:
    return __all__
