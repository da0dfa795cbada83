"""Settings come from LAKEFOLD_* variables and lakefold.toml; mistakes are one clear error."""

from pathlib import Path

import pytest

from lakefold.exceptions import ConfigurationError
from lakefold.settings import load_settings


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


def test_misspelt_variable_is_an_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAKEFOLD_DNS", "host=db")
    with pytest.raises(ConfigurationError, match="unknown setting LAKEFOLD_DNS; known settings"):
        load_settings()


def test_wrong_type_is_an_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAKEFOLD_LOG_LEVEL", "LOUD")
    with pytest.raises(ConfigurationError, match="LAKEFOLD_LOG_LEVEL"):
        load_settings()
