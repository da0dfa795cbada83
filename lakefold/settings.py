"""Settings: environment variables with the ``LAKEFOLD_`` prefix, or an optional ``lakefold.toml``.

Environment variables win over the file. A misspelt ``LAKEFOLD_*`` variable is an error rather
than silently ignored, because a typo in a DSN variable would otherwise point lakefold at the
embedded default database.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from lakefold.exceptions import ConfigurationError

ENV_PREFIX = "LAKEFOLD_"
# Variables that share the prefix but are read elsewhere (the test harness), not settings.
_FOREIGN_VARIABLES = frozenset({"LAKEFOLD_TEST_DSN", "LAKEFOLD_TEST_REDIS_URL"})


class Settings(BaseSettings):
    """Where lakefold's data lives and which services it talks to."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        toml_file="lakefold.toml",
        extra="forbid",
        frozen=True,
    )

    dsn: SecretStr | None = Field(
        default=None,
        description="Source PostgreSQL DSN. Unset: a throwaway local server under `home`.",
    )
    store_dsn: SecretStr | None = Field(
        default=None,
        description="PostgreSQL DSN of lakefold's own store (schema `lakefold`). Unset: `dsn`.",
    )
    redis_url: SecretStr | None = Field(
        default=None, description="Redis URL for cache targets. Unset: a throwaway local Redis."
    )
    home: Path = Field(default=Path(".lakefold"), description="Local state: lake, services.")
    lake_dir: Path | None = Field(default=None, description="Delta tables. Unset: `home`/lake.")
    spark_master: str = Field(default="local[*]", description="Spark master URL.")
    spark_conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark config.")
    projections: str | None = Field(
        default=None, description="Python file or module that defines the projections."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))

    @property
    def lake_path(self) -> Path:
        """The directory that holds the Delta tables."""
        return self.lake_dir if self.lake_dir is not None else self.home / "lake"

    def source_dsn(self) -> str | None:
        """The source DSN in clear text (for connecting; never log it: use mask_dsn)."""
        return self.dsn.get_secret_value() if self.dsn is not None else None

    def resolved_store_dsn(self) -> str | None:
        """The store DSN in clear text, defaulting to the source DSN."""
        secret = self.store_dsn if self.store_dsn is not None else self.dsn
        return secret.get_secret_value() if secret is not None else None


def load_settings(**overrides: object) -> Settings:
    """Read settings from the environment and ``lakefold.toml``.

    Raises ConfigurationError with a one-line explanation for a misspelt variable or a value of
    the wrong type.
    """
    known = {ENV_PREFIX + name.upper() for name in Settings.model_fields}
    unknown = sorted(
        name
        for name in os.environ
        if name.startswith(ENV_PREFIX) and name not in known and name not in _FOREIGN_VARIABLES
    )
    if unknown:
        raise ConfigurationError(
            f"unknown setting {', '.join(unknown)}; known settings are {', '.join(sorted(known))}"
        )
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as e:
        problems = "; ".join(
            f"{ENV_PREFIX}{'.'.join(str(p) for p in err['loc']).upper()}: {err['msg']}"
            for err in e.errors()
        )
        raise ConfigurationError(f"invalid setting: {problems}") from e
