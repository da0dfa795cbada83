"""The JVM jars ``make peers`` fetches with Maven (delta-spark and hadoop-aws for a session, the
benches' Flink and Debezium): where they are kept, and which of the needed ones a directory
lacks."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Final

#: ``make peers`` puts each library's jars in a directory of its own under this one.
PEERS_DIR: Final = Path.home() / ".cache" / "lakefold" / "peers"


def fetched_jars(where: Path, required: Iterable[str]) -> tuple[list[Path], list[str]]:
    """The jars in ``where`` (sorted), and the names of the ``required`` ones (file-name
    prefixes such as ``"hadoop-aws-"``) that none of them is."""
    jars = sorted(where.glob("*.jar")) if where.is_dir() else []
    missing = [prefix.rstrip("-") for prefix in required
               if not any(jar.name.startswith(prefix) for jar in jars)]
    return jars, missing
