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
from lakefold.core.object_store import ObjectStore, use_object_store

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
    s3_bucket: str | None = Field(
        default=None,
        description="S3 bucket of the lake (docs/object-storage.md). Unset: the lake is local.",
    )
    s3_prefix: str = Field(default="lake", description="The lake's prefix in `s3_bucket`.")
    s3_endpoint: str | None = Field(
        default=None, description="S3-compatible endpoint URL. Unset: AWS for `s3_region`.",
    )
    s3_region: str = Field(default="us-east-1", description="S3 region (signing).")
    s3_access_key_id: SecretStr | None = Field(default=None, description="S3 access key id.")
    s3_secret_access_key: SecretStr | None = Field(default=None, description="S3 secret key.")
    s3_path_style: bool = Field(
        default=True, description="Address buckets as endpoint/bucket (most self-hosted stores).",
    )
    s3_commit: Literal["conditional-put", "unsafe-rename"] = Field(
        default="conditional-put",
        description="Delta commit safety: conditional put (If-None-Match), or unsafe rename "
                    "(one writer per table only, for stores that ignore If-None-Match).",
    )
    spark_master: str = Field(default="local[*]", description="Spark master URL.")
    spark_conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark config.")
    delta_spark: bool = Field(
        default=False,
        description="Start Spark with delta-spark (its jars, Delta SQL, format('delta')); "
                    "lakefold then reads tables with deletion vectors or column mapping "
                    "through it. Writes stay with delta-rs. Needs the jars: `make peers`.",
    )
    delta_spark_jars: Path | None = Field(
        default=None,
        description="Directory of delta-spark's jars. Unset: ~/.cache/lakefold/peers/"
                    "delta-spark, where `make peers` puts them.",
    )
    hadoop_aws_jars: Path | None = Field(
        default=None,
        description="Directory of hadoop-aws's jars (Spark checkpoints on the S3 bucket). "
                    "Unset: ~/.cache/lakefold/peers/hadoop-aws, where `make peers` puts them.",
    )
    projections: str | None = Field(
        default=None, description="Python file or module that defines the projections."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="WARNING",
        description="The least severe of lakefold's log lines that are written (the CLI "
                    "writes them to stderr): INFO adds snapshot progress, compaction and "
                    "resumptions.",
    )
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

    def object_store(self) -> ObjectStore | None:
        """The object store of the lake when ``s3_bucket`` is set, else None."""
        if not self.s3_bucket:
            return None
        return ObjectStore(
            bucket=self.s3_bucket, endpoint=self.s3_endpoint or None, region=self.s3_region,
            access_key_id=_clear(self.s3_access_key_id),
            secret_access_key=_clear(self.s3_secret_access_key),
            path_style=self.s3_path_style, commit=self.s3_commit)

    @property
    def lake_location(self) -> str | Path:
        """Where the Delta tables live: ``s3://bucket/prefix`` with ``s3_bucket`` set, else
        ``lake_path``."""
        if self.s3_bucket:
            prefix = self.s3_prefix.strip("/")
            return f"s3://{self.s3_bucket}/{prefix}" if prefix else f"s3://{self.s3_bucket}"
        return self.lake_path

    def source_dsn(self) -> str | None:
        """The source DSN in clear text (for connecting; never log it: use mask_dsn)."""
        return self.dsn.get_secret_value() if self.dsn is not None else None

    def resolved_store_dsn(self) -> str | None:
        """The store DSN in clear text, defaulting to the source DSN."""
        secret = self.store_dsn if self.store_dsn is not None else self.dsn
        return secret.get_secret_value() if secret is not None else None


def _clear(secret: SecretStr | None) -> str | None:
    return secret.get_secret_value() if secret is not None else None


def load_settings(**overrides: object) -> Settings:
    """Read settings from the environment and ``lakefold.toml``.

    Unknown ``LAKEFOLD_*`` variables are ignored, each with a warning (see
    ``warn_unknown_variables``). Raises ConfigurationError with a one-line explanation for a
    value of the wrong type, an unknown key in ``lakefold.toml``, or a DSN that libpq cannot
    parse as written (``check_dsn``), or an object store setting that cannot be used. With
    ``s3_bucket`` set, registers the lake's object store for this process.
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
    # The lake's object store, for every Delta reader and writer of this process (the lower
    # layers look a table URI's bucket up there: lakefold.core.object_store).
    use_object_store(settings.object_store())
    if "log_level" in settings.model_fields_set:  # unset: the process's own logging rules
        logging.getLogger("lakefold").setLevel(settings.log_level)
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
