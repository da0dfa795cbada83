"""Test harness: real PostgreSQL, Redis and Spark from session fixtures (see tests/fixtures)."""

pytest_plugins = [
    "tests.fixtures.postgres",
    "tests.fixtures.redis",
    "tests.fixtures.spark",
]
