"""Test harness: real PostgreSQL, Redis, S3 (SeaweedFS) and Spark from session fixtures (see
tests/fixtures)."""

from typing import Any

pytest_plugins = [
    "tests.fixtures.postgres",
    "tests.fixtures.redis",
    "tests.fixtures.s3",
    "tests.fixtures.spark",
    "tests.fixtures.spark_cluster",
]


def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    """``--dist loadfile`` (whole files to a worker, so module fixtures start once), with the
    console's files as one unit: they share one running system (a package fixture of capture,
    runner and console, ~40 s to start), which a worker would otherwise start again for each
    console file it ran between others."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):  # type: ignore[misc]  # xdist has no types
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith("tests/console/"):
                return "tests/console"
            return str(super()._split_scope(nodeid))

    return Scheduling(config, log)
