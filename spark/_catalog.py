"""Which materialized tables exist, under which names: the ``TableCatalog`` protocol.

``lakefold query`` registers every table of a catalog under its name. ``LakeCatalog`` lists the
Delta tables directly under a lake directory: the directory name is the table name. The
projections layer implements the same one-method protocol with a generation-aware catalog
(name → the Delta path of the live generation, ``lakefold.projections.table_catalog``); the
application chooses the catalog and passes it in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from lakefold.core.object_store import filesystem_for
from lakefold.spark._delta_commit import explain_store_failure
from lakefold.spark._delta_target import normalize_table_uri
from lakefold.spark.exceptions import NotADeltaTableError, UnknownTableError

DELTA_LOG = "_delta_log"


@runtime_checkable
class TableCatalog(Protocol):
    """Names of the materialized tables and where their Delta tables are."""

    def tables(self) -> Mapping[str, str]:
        """Table name → Delta table path or URI. Names are unique; the map is a snapshot."""
        ...


def is_delta_table(path: Path | str) -> bool:
    """True when ``path`` (a directory, or an ``s3://`` URI) holds a Delta log."""
    text = str(path)
    if "://" in text and not text.startswith("file://"):
        import pyarrow.fs as pafs

        fs, root = filesystem_for(text.rstrip("/"))
        try:
            return bool(fs.get_file_info(f"{root}/{DELTA_LOG}").type == pafs.FileType.Directory)
        except OSError:
            explain_store_failure(text)
            raise
    return (Path(text.removeprefix("file://")) / DELTA_LOG).is_dir()


@dataclass(frozen=True)
class LakeCatalog:
    """The Delta tables directly under ``lake_path``, named by their directory.

    Directories whose name starts with ``_`` or ``.`` are not tables (staging, checkpoints).
    A missing lake directory is an empty catalog.
    """

    lake_path: Path | str

    def tables(self) -> dict[str, str]:
        if "://" in str(self.lake_path):
            return self._object_store_tables(str(self.lake_path).rstrip("/"))
        root = Path(self.lake_path).expanduser()
        if not root.is_dir():
            return {}
        return {
            child.name: normalize_table_uri(child)
            for child in sorted(root.iterdir())
            if child.is_dir() and not child.name.startswith(("_", ".")) and is_delta_table(child)
        }

    @staticmethod
    def _object_store_tables(uri: str) -> dict[str, str]:
        import pyarrow.fs as pafs

        fs, root = filesystem_for(uri)
        try:
            children = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
        except OSError:
            explain_store_failure(uri)
            raise
        return {
            child.base_name: f"{uri}/{child.base_name}"
            for child in sorted(children, key=lambda c: c.base_name)
            if child.type == pafs.FileType.Directory
            and not child.base_name.startswith(("_", "."))
            and is_delta_table(f"{uri}/{child.base_name}")
        }


@dataclass(frozen=True)
class StaticCatalog:
    """A fixed name → path map (tests, scripts, a user's own table list)."""

    entries: Mapping[str, str] = field(default_factory=dict)

    def tables(self) -> dict[str, str]:
        return {name: normalize_table_uri(path) for name, path in self.entries.items()}


def resolve_table(catalog: TableCatalog, name_or_path: str) -> str:
    """The Delta path of a table given by catalog name, or by path.

    Raises UnknownTableError, listing the known names, when it is neither a catalog name nor a
    Delta table directory.
    """
    known = catalog.tables()
    if name_or_path in known:
        return known[name_or_path]
    candidate = Path(name_or_path).expanduser()
    if "://" in name_or_path or is_delta_table(candidate):
        return normalize_table_uri(name_or_path)
    if candidate.exists():
        raise NotADeltaTableError(f"{candidate} is not a Delta table (no {DELTA_LOG} directory)")
    raise UnknownTableError(
        f"unknown table {name_or_path!r}; known tables: {', '.join(sorted(known)) or 'none'}"
    )
