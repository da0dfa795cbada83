"""The generation-aware table catalog for ``lakefold query`` (the Spark layer's
``TableCatalog`` protocol): every projection with a Delta target under its own name, at the
Delta path of its *current* generation, plus the plain Delta tables of the lake directory.

A query that resolves names through it during a rebuild keeps reading the old generation until
the catalog switches, then reads the new one: it never sees a generation being built.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psycopg

from lakefold.core.dsn import error_text, mask_dsn
from lakefold.projections.exceptions import CatalogUnavailableError


@dataclass(frozen=True)
class ProjectionTableCatalog:
    """Projection name → current Delta path, read from the catalog on each ``tables()``."""

    store_dsn: str | None
    lake_path: Path | str

    def projection_tables(self) -> dict[str, str]:
        """Delta-target projections that have a table at their current generation."""
        if self.store_dsn is None:
            return {}
        try:
            with psycopg.connect(self.store_dsn, autocommit=True, connect_timeout=10) as conn:
                present = conn.execute(
                    "SELECT to_regclass('lakefold.projections') IS NOT NULL").fetchone()
                if not (present and present[0]):
                    return {}
                rows = conn.execute(
                    "SELECT p.name, g.locations->>'delta' FROM lakefold.projections p "
                    "JOIN lakefold.projection_generations g ON g.name = p.name "
                    "AND g.generation = p.current_generation "
                    "WHERE p.target_kind = 'delta' ORDER BY p.name").fetchall()
        except psycopg.OperationalError as e:
            raise CatalogUnavailableError(
                f"cannot read the projection catalog at {mask_dsn(self.store_dsn)} "
                f"({error_text(e)}); "
                "check LAKEFOLD_STORE_DSN"
            ) from e
        from lakefold.spark.internals import is_delta_table

        return {str(name): str(path) for name, path in rows if is_delta_table(str(path))}

    def tables(self) -> dict[str, str]:
        """Lake tables, overridden by projections of the same name."""
        from lakefold.spark import LakeCatalog

        return {**LakeCatalog(self.lake_path).tables(), **self.projection_tables()}
