"""Settings: environment variables with the ``LAKEFOLD_`` prefix, or an optional ``lakefold.toml``.

Environment variables win over the file. A ``LAKEFOLD_*`` variable that is neither a setting nor
one of the documented environment-only variables (``DOCUMENTED_ENVIRONMENT_ONLY``) is ignored
with a warning naming the closest known name: a typo in a DSN variable is then visible, and an
unrelated variable that shares the prefix (another tool's, an older lakefold's) does not stop
every command. Only the demo uses throwaway local servers when no DSN is set; the other
commands say which variable to set.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from lakefold.core.dsn import check_dsn
from lakefold.core.exceptions import ConfigurationError

ENV_PREFIX = "LAKEFOLD_"
#: Documented variables that share the prefix but are read from the environment directly, not
#: settings: the Spark class archive switch (``lakefold.spark``) and the test harness's servers.
DOCUMENTED_ENVIRONMENT_ONLY = frozenset({
    "LAKEFOLD_CLASS_ARCHIVE", "LAKEFOLD_TEST_DSN", "LAKEFOLD_TEST_REDIS_URL",
})
log = logging.getLogger(__name__)
_warned: set[str] = set()  # unknown names already warned about in this process


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
    console_token: SecretStr | None = Field(
        default=None, description="Token every request to `lakefold console` must carry.",
    )
    console_token_file: Path | None = Field(
        default=None, description="File holding the console's token (its one line).",
    )

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

    Unknown ``LAKEFOLD_*`` variables are ignored, each with a warning (see
    ``warn_unknown_variables``). Raises ConfigurationError with a one-line explanation for a
    value of the wrong type, an unknown key in ``lakefold.toml``, or a DSN that libpq cannot
    parse as written (``check_dsn``).
    """
    warn_unknown_variables(os.environ)
    try:
        settings = Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as e:
        problems = "; ".join(
            f"{ENV_PREFIX}{'.'.join(str(p) for p in err['loc']).upper()}: {err['msg']}"
            for err in e.errors()
        )
        raise ConfigurationError(f"invalid setting: {problems}") from e
    for name in ("dsn", "store_dsn"):  # a DSN libpq cannot read: one line, quoting none of it
        secret = getattr(settings, name)
        if secret is not None and secret.get_secret_value():
            check_dsn(secret.get_secret_value(), what=f"{ENV_PREFIX}{name.upper()}")
    return settings


def known_variables() -> frozenset[str]:
    """Every ``LAKEFOLD_*`` name lakefold reads: the settings and the environment-only ones."""
    return frozenset(ENV_PREFIX + name.upper() for name in Settings.model_fields) \
        | DOCUMENTED_ENVIRONMENT_ONLY


def warn_unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """Log a warning for each ``LAKEFOLD_*`` name in ``environ`` that lakefold does not read
    (once per process and name), naming the closest known name when one is close; returns the
    unknown names, sorted. Never raises: an unknown variable is ignored."""
    known = known_variables()
    unknown = sorted(name for name in environ if name.startswith(ENV_PREFIX)
                     and name not in known)
    suffixes = sorted(name.removeprefix(ENV_PREFIX) for name in known)
    for name in unknown:
        if name in _warned:
            continue
        _warned.add(name)
        # Compare without the shared prefix, which would make every name look close.
        close = difflib.get_close_matches(name.removeprefix(ENV_PREFIX), suffixes, n=1,
                                          cutoff=0.6)
        hint = f"did you mean {ENV_PREFIX}{close[0]}? " if close else ""
        log.warning("ignored unknown setting %s: %sknown settings are %s", name, hint,
                    ", ".join(sorted(known)))
    return unknown
