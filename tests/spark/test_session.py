"""The driver JVM's options: lakefold's first, the user's last, and never two collectors."""

from __future__ import annotations

import pytest

from lakefold.spark._session import driver_java_options


@pytest.fixture(autouse=True)
def _no_class_archive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKEFOLD_CLASS_ARCHIVE", "off")


def test_a_local_driver_gets_the_throughput_collector_unless_the_user_chose_one() -> None:
    default = driver_java_options(None, {}).split()
    assert default[0].startswith("-Dlog4j2.configurationFile=")
    assert "-XX:+UseParallelGC" in default
    mine = driver_java_options("local[2]", {
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xss4m"})
    assert [o for o in mine.split() if o.endswith("GC")] == ["-XX:+UseSerialGC"]
    assert mine.endswith("-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xss4m")
    cluster = driver_java_options("spark://127.0.0.1:7077", {})
    assert "GC" not in cluster
