"""A txlog root as Spark's own Hadoop filesystems see it: its URL and configuration.

txlog's store reaches S3 with fsspec/obstore and ``storage_options``; the JVM paths
(the JVM scan, the JVM writer, the SQL scan) open the same objects with Hadoop's S3A
filesystem (hadoop-aws) inside Spark's executors.  :func:`locate` maps one to the other
so that a user states endpoint and credentials once, in ``storage_options``:

* ``s3://`` and ``s3a://`` roots become ``s3a://`` (open-source Hadoop has no ``s3://``);
* the options become S3A settings scoped to the root's bucket
  (``fs.s3a.bucket.<bucket>.*``), which leave every other bucket's settings alone.

:func:`prepare` also puts those settings into the SparkContext's Hadoop configuration,
which Spark ships to the executors with each scan and write.  Other schemes (local
paths, ``gs://``, ``abfss://``) keep their URL and get no settings.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from txlog.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from txlog.storage import ObjectStore

S3A = "org.apache.hadoop.fs.s3a"
#: s3fs options that tune txlog's own client and mean nothing to S3A.
_CLIENT_ONLY = frozenset({
    "txlog_client", "use_listings_cache", "listings_expiry_time", "max_paths",
    "skip_instance_cache", "default_block_size", "default_fill_cache", "default_cache_type",
    "cache_regions", "max_concurrency", "fixed_upload_size", "retries", "version_aware",
    "requester_pays", "s3_additional_kwargs",
})
_MAPPED = frozenset({"key", "secret", "username", "password", "token", "anon",
                     "endpoint_url", "region", "region_name", "use_ssl", "client_kwargs",
                     "config_kwargs"})
_APPLY_LOCK = threading.Lock()


@dataclass(frozen=True)
class HadoopLocation:
    """A txlog root for Hadoop: ``root`` is its URL, ``conf`` the settings it needs."""

    root: str
    conf: dict[str, str] = field(default_factory=dict)

    def path(self, key: str) -> str:
        """The Hadoop URL of the object ``key`` under the root."""
        return f"{self.root}/{key}"


def hadoop_url(url: str) -> str:
    """``url`` with the scheme Hadoop reads it with (``s3://`` becomes ``s3a://``)."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() in ("s3", "s3a"):
        return "s3a://" + rest
    return url


def locate(url: str, storage_options: Mapping[str, Any] | None = None) -> HadoopLocation:
    """The root at ``url`` (a txlog root or object URL) as Hadoop's, with the S3A settings
    equivalent to ``storage_options`` (pure: nothing is applied)."""
    root = hadoop_url(url.rstrip("/"))
    if not root.startswith("s3a://"):
        return HadoopLocation(root)
    bucket = urlsplit(root).netloc
    if not bucket:
        raise ConfigError(f"store URL {url!r} names no bucket")
    return HadoopLocation(root, s3a_settings(bucket, storage_options or {}))


def s3a_settings(bucket: str, options: Mapping[str, Any]) -> dict[str, str]:
    """S3A settings for ``bucket`` from txlog's (s3fs-style) storage options.

    Options S3A has no equivalent for are named in a warning: Spark then reaches the
    bucket with whatever else its Hadoop configuration says."""
    client = dict(options.get("client_kwargs") or {})
    config = dict(options.get("config_kwargs") or {})
    unmapped = sorted(set(options) - _MAPPED - _CLIENT_ONLY)
    unmapped += [f"client_kwargs.{k}" for k in sorted(set(client) - {"endpoint_url",
                                                                      "region_name"})]
    unmapped += [f"config_kwargs.{k}" for k in sorted(set(config) - {"s3", "region_name"})]
    out: dict[str, str] = {}
    endpoint = options.get("endpoint_url") or client.get("endpoint_url")
    region = (options.get("region") or options.get("region_name") or client.get("region_name")
              or config.get("region_name"))
    if endpoint:
        endpoint = str(endpoint).rstrip("/")
        out["endpoint"] = endpoint
        # txlog's own S3 client addresses an endpoint it is given path-style (as
        # S3-compatible servers expect); S3A is told the same unless the options say.
        out["path.style.access"] = "true"
        if endpoint.startswith("http://") or options.get("use_ssl") is False:
            out["connection.ssl.enabled"] = "false"
        # A region is needed to sign; S3-compatible servers take any, as txlog's client
        # assumes.
        region = region or os.environ.get("AWS_REGION") or os.environ.get(
            "AWS_DEFAULT_REGION") or "us-east-1"
    if region:
        out["endpoint.region"] = str(region)
    style = (config.get("s3") or {}).get("addressing_style")
    if style in ("path", "virtual"):
        out["path.style.access"] = str(style == "path").lower()
    elif style is not None:
        unmapped.append("config_kwargs.s3.addressing_style")
    key = options.get("key", options.get("username"))
    secret = options.get("secret", options.get("password"))
    if options.get("anon"):
        out["aws.credentials.provider"] = f"{S3A}.AnonymousAWSCredentialsProvider"
    elif key is not None or secret is not None:
        if key is None or secret is None:
            raise ConfigError("storage_options give only one of 'key' and 'secret'; "
                              "S3 needs both (or neither, for the default credentials)")
        out["access.key"] = str(key)
        out["secret.key"] = str(secret)
        if options.get("token"):
            out["session.token"] = str(options["token"])
            out["aws.credentials.provider"] = f"{S3A}.TemporaryAWSCredentialsProvider"
        else:
            out["aws.credentials.provider"] = f"{S3A}.SimpleAWSCredentialsProvider"
    if unmapped:
        warnings.warn(f"storage option(s) {', '.join(unmapped)} have no S3A equivalent and "
                      f"are not passed to Spark's filesystem for s3a://{bucket}; set the "
                      f"matching fs.s3a.bucket.{bucket}.* keys in Spark if it needs them",
                      RuntimeWarning, stacklevel=3)
    return {f"fs.s3a.bucket.{bucket}.{k}": v for k, v in out.items()}


def for_store(store: ObjectStore) -> HadoopLocation:
    """The store's root as Hadoop's (its options included, for remote stores)."""
    options = getattr(store, "storage_options", None) or {}
    # full_path() takes object keys: the root's URL is its first object's, cut.
    return locate(store.full_path("x")[:-2], options)


def apply(spark: SparkSession, location: HadoopLocation) -> None:
    """Put the location's settings into ``spark``'s SparkContext Hadoop configuration,
    from which every scan and write ships its configuration to the executors.

    A no-op on Spark Connect (the client has no JVM; the server's own configuration
    applies there) and when nothing is to be set."""
    if not location.conf:
        return
    try:
        jsc = spark.sparkContext._jsc
    except Exception:  # Spark Connect: no SparkContext on the client
        return
    assert jsc is not None
    conf = jsc.hadoopConfiguration()
    prefix = f"fs.s3a.bucket.{urlsplit(location.root).netloc}."
    changed = []
    with _APPLY_LOCK:
        for k, v in location.conf.items():
            old = conf.get(k)
            if old != v:
                if old is not None:  # names only: the values may be secrets
                    changed.append(k.removeprefix(prefix))
                conf.set(k, v)
    if changed:
        warnings.warn(f"{location.root}: storage_options change {', '.join(sorted(changed))} "
                      "from what this Spark application used before; Hadoop keeps one S3A "
                      "filesystem per bucket per JVM, and those already open keep the old "
                      "settings. Use one set of storage_options per bucket in an application",
                      RuntimeWarning, stacklevel=3)


def prepare(spark: SparkSession, store: ObjectStore) -> HadoopLocation:
    """``for_store`` then ``apply``: the store's root as the JVM paths open it."""
    location = for_store(store)
    apply(spark, location)
    return location


def missing_filesystem_hint(scheme: str, hadoop_version: str | None) -> str:
    """What to add to Spark so that it has a filesystem for ``scheme``."""
    if scheme in ("s3a", "s3"):
        version = hadoop_version or "<Spark's Hadoop version>"
        return (f"add hadoop-aws-{version}.jar and the AWS SDK bundle it depends on "
                f"(software.amazon.awssdk:bundle) to Spark, e.g. --packages "
                f"org.apache.hadoop:hadoop-aws:{version} (it must match this Spark's "
                f"Hadoop, {version})")
    return ("add the store's Hadoop connector (gcs-connector for gs://, hadoop-azure for "
            "abfss://) and its credentials to Spark")
