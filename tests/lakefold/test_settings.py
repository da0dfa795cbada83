"""Settings come from LAKEFOLD_* variables and lakefold.toml; mistakes are one clear error."""

import logging
import re
from pathlib import Path

import pytest

from lakefold.core.exceptions import ConfigurationError
from lakefold.settings import load_settings

REPO = Path(__file__).resolve().parents[2]
#: What a user reads: the README and the pages of docs/ (the settings table is in
#: docs/configuration.md).
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
#: A valid value for the documented settings that are not a DSN, a path or free text.
VALID = {"LAKEFOLD_SPARK_CONF": '{"spark.ui.enabled": "false"}', "LAKEFOLD_LOG_LEVEL": "INFO",
         "LAKEFOLD_S3_COMMIT": "conditional-put", "LAKEFOLD_S3_PATH_STYLE": "true",
         "LAKEFOLD_S3_ENDPOINT": "http://127.0.0.1:8333", "LAKEFOLD_S3_BUCKET": "lake"}


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees the warnings of its own variables (they are given once per process)."""
    import lakefold.settings

    monkeypatch.setattr(lakefold.settings, "_warned", set(), raising=False)


def test_defaults_use_embedded_services(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    settings = load_settings()
    assert settings.dsn is None
    assert settings.resolved_store_dsn() is None
    assert settings.lake_path == Path(".lakefold/lake")
    assert settings.spark_master == "local[*]"


def test_environment_overrides_and_store_defaults_to_source(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAKEFOLD_DSN", "host=db user=app password=hunter2")
    monkeypatch.setenv("LAKEFOLD_LAKE_DIR", "/data/lake")
    settings = load_settings()
    assert settings.resolved_store_dsn() == "host=db user=app password=hunter2"
    assert settings.lake_path == Path("/data/lake")
    assert "hunter2" not in repr(settings)


def test_toml_file_is_read_and_environment_wins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lakefold.toml").write_text(
        'spark_master = "spark://127.0.0.1:7077"\nhome = "/srv/lakefold"\n'
    )
    monkeypatch.setenv("LAKEFOLD_HOME", "/override")
    settings = load_settings()
    assert settings.spark_master == "spark://127.0.0.1:7077"
    assert settings.home == Path("/override")


def test_misspelt_variable_warns_naming_the_closest_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAKEFOLD_DNS", "host=db")
    monkeypatch.setenv("LAKEFOLD_SPARK_MASTR", "local[2]")
    with caplog.at_level(logging.WARNING, logger="lakefold.settings"):
        settings = load_settings()
    assert settings.dsn is None  # ignored, not guessed
    warnings = sorted(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert len(warnings) == 2, warnings
    assert "LAKEFOLD_DNS" in warnings[0] and "did you mean LAKEFOLD_DSN?" in warnings[0]
    assert "LAKEFOLD_SPARK_MASTR" in warnings[1]
    assert "did you mean LAKEFOLD_SPARK_MASTER?" in warnings[1]
    caplog.clear()
    load_settings()  # once per process: a command that reads its settings twice warns once
    assert not caplog.records


@pytest.mark.parametrize("name", ["LAKEFOLD_CLASS_ARCHIVE", "LAKEFOLD_TEST_DSN",
                                  "LAKEFOLD_TEST_REDIS_URL"])
def test_documented_environment_only_variables_are_accepted_silently(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    name: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(name, "off")
    with caplog.at_level(logging.DEBUG, logger="lakefold.settings"):
        load_settings()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_every_documented_variable_is_known(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """Each ``LAKEFOLD_*`` name the README or docs/ mention is a setting or a documented
    environment-only variable: none of them draws a warning."""
    documented = {name for page in DOCS
                  for name in re.findall(r"LAKEFOLD_[A-Z0-9_]*[A-Z0-9]", page.read_text())}
    assert {"LAKEFOLD_CLASS_ARCHIVE", "LAKEFOLD_DSN", "LAKEFOLD_TEST_DSN"} <= documented
    monkeypatch.chdir(tmp_path)
    for name in documented:  # a valid value for each of them
        monkeypatch.setenv(name, "host=db" if name.endswith("DSN") else VALID.get(name, "off"))
    with caplog.at_level(logging.WARNING, logger="lakefold.settings"):
        load_settings()
    assert not caplog.records, [r.getMessage() for r in caplog.records]


def test_unrelated_variable_far_from_any_setting_warns_without_a_guess(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAKEFOLD_XYZZY_QUUX_FROB", "1")
    with caplog.at_level(logging.WARNING, logger="lakefold.settings"):
        load_settings()
    (record,) = caplog.records
    assert "LAKEFOLD_XYZZY_QUUX_FROB" in record.getMessage()
    assert "did you mean" not in record.getMessage()
    assert "ignored" in record.getMessage()


def test_wrong_type_is_an_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAKEFOLD_LOG_LEVEL", "LOUD")
    with pytest.raises(ConfigurationError, match="LAKEFOLD_LOG_LEVEL"):
        load_settings()


def test_object_store_settings_move_the_lake_and_keep_the_secret(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from lakefold.core.object_store import forget_object_store, storage_options_for

    monkeypatch.chdir(tmp_path)
    assert load_settings().object_store() is None
    monkeypatch.setenv("LAKEFOLD_S3_BUCKET", "settings-lake")
    monkeypatch.setenv("LAKEFOLD_S3_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("LAKEFOLD_S3_ACCESS_KEY_ID", "AKSETTINGS")
    monkeypatch.setenv("LAKEFOLD_S3_SECRET_ACCESS_KEY", "a-secret-never-shown")
    try:
        settings = load_settings()
        assert settings.lake_location == "s3://settings-lake/lake"
        store = settings.object_store()
        assert store is not None and store.bucket == "settings-lake"
        assert "a-secret-never-shown" not in repr(settings) + repr(store) + store.describe()
        assert "AKSETTINGS" not in repr(settings) + repr(store)
        # Registered for this process: a table URI of the bucket gets the store's options.
        options = storage_options_for("s3://settings-lake/lake/t")
        assert options is not None and options["endpoint"] == "http://127.0.0.1:9"
        assert options["conditional_put"] == "etag" and options["allow_http"] == "true"
        assert "AWS_S3_ALLOW_UNSAFE_RENAME" not in options
        assert storage_options_for("s3://another-bucket/t") is None
    finally:
        forget_object_store("settings-lake")
    monkeypatch.setenv("LAKEFOLD_S3_ENDPOINT", "127.0.0.1:9")
    with pytest.raises(ConfigurationError, match="LAKEFOLD_S3_ENDPOINT"):
        load_settings()


def test_the_log_level_setting_decides_which_lines_are_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    lakefold_logger = logging.getLogger("lakefold")
    before = lakefold_logger.level
    compaction = logging.getLogger("lakefold.store._compaction")
    caplog.set_level(logging.DEBUG)  # every line lakefold's loggers let through is seen
    try:
        lakefold_logger.setLevel(logging.WARNING)  # as the CLI starts
        load_settings()  # unset: the level stays
        compaction.info("unset")
        monkeypatch.setenv("LAKEFOLD_LOG_LEVEL", "INFO")
        load_settings()
        compaction.info("info")
        compaction.debug("debug")
        monkeypatch.setenv("LAKEFOLD_LOG_LEVEL", "ERROR")
        load_settings()
        compaction.warning("warning")
        compaction.error("error")
    finally:
        lakefold_logger.setLevel(before)
    assert [r.getMessage() for r in caplog.records
            if r.name.startswith("lakefold.store")] == ["info", "error"]
