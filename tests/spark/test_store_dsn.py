"""The sources' store DSN: the ``dsn`` option, else the environment, with the settings'
variables and precedence (the sources run in Spark's workers and never read the settings)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakefold.settings import load_settings
from lakefold.spark import SparkLayerError
from lakefold.spark._store_dsn import store_dsn_option


@pytest.mark.parametrize("environ", [
    {"LAKEFOLD_STORE_DSN": "host=store", "LAKEFOLD_DSN": "host=source"},
    {"LAKEFOLD_DSN": "host=source"},
    {"lakefold_store_dsn": "host=store", "LAKEFOLD_DSN": "host=source"},
    {"LAKEFOLD_STORE_DSN": "host=store"},
], ids=["store-first", "source-dsn", "any-case", "store-only"])
def test_environment_resolves_as_the_settings_do(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # no lakefold.toml
    for name in ("LAKEFOLD_STORE_DSN", "LAKEFOLD_DSN", "lakefold_store_dsn"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert store_dsn_option({}, environ) == load_settings().resolved_store_dsn()
    assert store_dsn_option({"dsn": "host=option"}, environ) == "host=option"


def test_no_dsn_anywhere_names_the_option_and_the_variables() -> None:
    with pytest.raises(SparkLayerError, match=r"\.option\('dsn', \.\.\.\) or set "
                                              "LAKEFOLD_STORE_DSN"):
        store_dsn_option({}, {"PATH": "/bin"})
    with pytest.raises(SparkLayerError, match="no store DSN"):
        store_dsn_option({"dsn": ""}, {"LAKEFOLD_STORE_DSN": ""})
