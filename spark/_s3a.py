"""Hadoop's S3A file system on a lakefold session, for Spark's own files on the lake's bucket.

lakefold's Delta tables on a bucket are written and read by delta-rs and pyarrow (in Python);
Spark itself touches storage for its streaming checkpoints only: the offset and commit logs
(the driver) and the state stores of stateful queries (the executors). With the lake on a
bucket, those go to ``s3a://BUCKET/PREFIX/_checkpoints/NAME/gN`` (``checkpoint_root``), which
needs Hadoop's ``hadoop-aws`` on the class path of the driver and of every executor.

Where the jars come from: ``make peers`` fetches ``org.apache.hadoop:hadoop-aws`` at
``HADOOP_AWS_VERSION`` (the Hadoop that pyspark bundles: ``jars/hadoop-client-api-3.5.0.jar``
for pyspark 4.2.0) and the AWS SDK bundle it was built with, with Maven into
``~/.cache/lakefold/peers/hadoop-aws`` (``infra/peers/hadoop-aws/pom.xml``). They go on
``spark.driver.extraClassPath`` and ``spark.executor.extraClassPath``, not ``spark.jars``: the
SDK bundle is ~690 MB, which ``spark.jars`` would copy into every executor's work directory;
a cluster's workers need the same directory (``make peers`` on each host, or a shared mount).

Credentials never go on a command line: the driver JVM is started by ``spark-submit`` with the
session's conf as arguments (visible to ``ps``), so the endpoint, region and path style are
conf (``spark.hadoop.fs.s3a.*``) while the access key and the secret are set on the running
driver's Hadoop configuration (``use_s3a_credentials``), which Spark ships to the executors'
state stores inside its serialized Hadoop configuration.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from lakefold.core.fetched_jars import PEERS_DIR, fetched_jars
from lakefold.spark.exceptions import SparkTerminalError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakefold.core.object_store import ObjectStore

#: The hadoop-aws release ``make peers`` fetches: pyspark 4.2.0's Hadoop.
HADOOP_AWS_VERSION: Final = "3.5.0"
#: Where ``make peers`` puts the jars.
DEFAULT_JARS_DIR: Final = PEERS_DIR / "hadoop-aws"
_REQUIRED: Final = ("hadoop-aws-", "bundle-")
_CLASS_PATHS: Final = ("spark.driver.extraClassPath", "spark.executor.extraClassPath")


class HadoopAwsJarsError(SparkTerminalError):
    """The lake is on a bucket, but hadoop-aws's jars are not where the setting says."""


def hadoop_aws_jars(jars_dir: Path | None = None) -> list[Path]:
    """The jars of ``jars_dir`` (default ``DEFAULT_JARS_DIR``), checked to hold hadoop-aws and
    the AWS SDK bundle; raises HadoopAwsJarsError naming the fix when they are missing."""
    where = jars_dir if jars_dir is not None else DEFAULT_JARS_DIR
    jars, missing = fetched_jars(where, _REQUIRED)
    if missing:
        raise HadoopAwsJarsError(
            f"the lake is on a bucket (LAKEFOLD_S3_BUCKET), whose Spark checkpoints need "
            f"hadoop-aws, but {where} has no {', '.join(missing)} jar; run `make peers` "
            f"(fetches org.apache.hadoop:hadoop-aws:{HADOOP_AWS_VERSION} with Maven), or set "
            "LAKEFOLD_HADOOP_AWS_JARS to a directory holding them")
    return jars


def with_s3a(conf: Mapping[str, str], store: ObjectStore,
             jars_dir: Path | None = None) -> dict[str, str]:
    """``conf`` plus what Spark needs to reach ``store`` through S3A: hadoop-aws's jars on the
    driver's and the executors' class paths, and the store's endpoint, region, path style and
    TLS as ``spark.hadoop.fs.s3a.*`` (never its credentials: ``use_s3a_credentials``)."""
    jars = [str(jar) for jar in hadoop_aws_jars(jars_dir)]
    merged = dict(conf)
    for key in _CLASS_PATHS:
        present = [p for p in merged.get(key, "").split(os.pathsep) if p]
        merged[key] = os.pathsep.join([*present, *(j for j in jars if j not in present)])
    hadoop = {"fs.s3a.path.style.access": "true" if store.path_style else "false",
              "fs.s3a.endpoint.region": store.region,
              # Spark's checkpoint files are small: buffer uploads in memory, not in temporary
              # files on the local disk
              "fs.s3a.fast.upload.buffer": "bytebuffer"}
    if store.endpoint:
        hadoop["fs.s3a.endpoint"] = store.endpoint
        hadoop["fs.s3a.connection.ssl.enabled"] = \
            "true" if urlsplit(store.endpoint).scheme == "https" else "false"
    for key, value in hadoop.items():
        merged.setdefault(f"spark.hadoop.{key}", value)
    return merged


def use_s3a_credentials(spark: SparkSession, store: ObjectStore) -> None:
    """Set ``store``'s access key and secret on the running driver's Hadoop configuration
    (nothing when the store has none: S3A's default chain then finds them)."""
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    if store.access_key_id is not None:
        hadoop.set("fs.s3a.access.key", store.access_key_id)
    if store.secret_access_key is not None:
        hadoop.set("fs.s3a.secret.key", store.secret_access_key)


def checkpoint_root(lake: str) -> str:
    """Where the Spark checkpoints of a lake on a bucket go: ``s3a://BUCKET/PREFIX/_checkpoints``
    for ``lake`` = ``s3://BUCKET/PREFIX`` (Hadoop names the S3 scheme ``s3a``; the leading
    underscore keeps it out of the lake's table listings)."""
    parts = urlsplit(lake.rstrip("/"))
    return f"s3a://{parts.netloc}{parts.path}/_checkpoints"
