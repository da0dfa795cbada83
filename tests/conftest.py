"""Test harness: real PostgreSQL, Redis, S3 (SeaweedFS) and Spark from session fixtures (see
tests/fixtures)."""

pytest_plugins = [
    "tests.fixtures.postgres",
    "tests.fixtures.redis",
    "tests.fixtures.s3",
    "tests.fixtures.spark",
]
