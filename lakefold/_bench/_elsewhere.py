"""``--master`` and ``--lake`` of the benchmarks that also measure away from ``local[*]`` and
the local disk (``bench replay`` and ``bench rebuild``): the options, the name of the figures
measured there, and the lake's object store."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from lakefold._bench.report import BenchmarkError

if TYPE_CHECKING:
    from lakefold.core.object_store import ObjectStore

MasterOption = Annotated[str | None, typer.Option(
    "--master", help="Also measure with the jobs on this Spark master (spark://HOST:PORT), "
    "beside local[*].", show_default=False)]
LakeOption = Annotated[str | None, typer.Option(
    "--lake", help="Also measure with the tables and checkpoints in this bucket "
    "(s3://BUCKET/PREFIX; endpoint and credentials from LAKEFOLD_S3_*), beside the local "
    "disk.", show_default=False)]


def elsewhere(master: str | None, lake: str | None) -> str | None:
    """The name of the figures measured with ``--master`` and/or ``--lake`` (None: neither)."""
    parts = [name for name, given in (("cluster", master), ("s3", lake)) if given]
    return "+".join(parts) or None


def lake_store(lake: str | None) -> ObjectStore | None:
    """The object store of ``--lake s3://BUCKET/PREFIX`` (endpoint and credentials from the
    LAKEFOLD_S3_* settings), registered for this process; None without ``--lake``."""
    if lake is None:
        return None
    from urllib.parse import urlsplit

    from lakefold.core.object_store import check_object_store
    from lakefold.settings import load_settings

    parts = urlsplit(lake)
    if parts.scheme != "s3" or not parts.netloc:
        raise BenchmarkError(f"--lake {lake!r} is not an s3://BUCKET/PREFIX URI")
    store = load_settings(s3_bucket=parts.netloc,
                          s3_prefix=parts.path.strip("/")).object_store()
    if store is not None:
        check_object_store(store)
    return store


def run_root(lake: str, scratch: Path) -> str:
    """This run's own prefix under ``lake`` (named as its local scratch directory), so that a
    run never finds an earlier run's tables or checkpoints there."""
    return f"{lake.rstrip('/')}/{scratch.name}"


def remove_run_root(root: str) -> None:
    """Delete what a run left under its prefix (best effort: the figures are measured)."""
    from lakefold.core.object_store import filesystem_for

    fs, path = filesystem_for(root)
    try:
        fs.delete_dir(path)  # its tables, and its Spark checkpoints under _checkpoints/
    except OSError:
        pass
