"""S3 through Spark's own filesystem: txlog roots at s3:// and s3a:// opened by S3A
(hadoop-aws) in Spark's executors, configured from txlog's storage_options
(spark_ext/hadoop_conf.py), against SeaweedFS on 127.0.0.1."""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import spark_procs

import spark_ext
import txlog
from spark_ext import hadoop_conf
from spark_ext.options import parse_read_options
from spark_ext.read_plan import plan_batch
from txlog.errors import ConfigError
from txlog.testing.servers import SeaweedServer

BUCKET = "fs.s3a.bucket.b."


def build(url: str, options: dict[str, Any], seed: int) -> list[tuple[int, int, str]]:
    """Topics ``in`` (transactions of 1-6 records over 2 partitions, every third aborted)
    and ``out`` (empty); returns ``in``'s committed (partition, offset, value) as txlog's
    consumer reads them."""
    print(f"seed={seed}")
    rng = random.Random(seed)
    log = txlog.connect(url, options)
    log.create_topic("in", partitions=2)
    log.create_topic("out", partitions=2)
    p = log.producer(transactional_id="s3a-tx")
    p.init_transactions()
    n = 0
    for i in range(9):
        p.begin_transaction()
        for _ in range(rng.randint(1, 6)):
            p.send("in", f"v{n}".encode(), key=f"k{n % 3}".encode(), partition=rng.randrange(2))
            n += 1
        p.flush()
        p.abort_transaction() if i % 3 == 2 else p.commit_transaction()
    return consumed(url, options, "in")


def consumed(url: str, options: dict[str, Any], topic: str) -> list[tuple[int, int, str]]:
    c = txlog.connect(url, options).consumer(auto_offset_reset="earliest")
    c.subscribe([topic])
    return sorted((r.partition, r.offset, bytes(r.value).decode())
                  for r in c.poll(max_records=10_000))


# -- the mapping (no Spark) --------------------------------------------------------------


def test_s3_and_s3a_roots_map_to_s3a_with_per_bucket_settings() -> None:
    options = {"key": "K", "secret": "S",
               "client_kwargs": {"endpoint_url": "http://127.0.0.1:9/", "region_name": "eu-1"}}
    for url in ("s3://b/lake", "s3a://b/lake/", "S3://b/lake"):
        where = hadoop_conf.locate(url, options)
        assert where.root == "s3a://b/lake" and where.path("topics/t/x") == "s3a://b/lake/topics/t/x"
        assert where.conf == {
            BUCKET + "endpoint": "http://127.0.0.1:9", BUCKET + "endpoint.region": "eu-1",
            BUCKET + "path.style.access": "true", BUCKET + "connection.ssl.enabled": "false",
            BUCKET + "access.key": "K", BUCKET + "secret.key": "S",
            BUCKET + "aws.credentials.provider": f"{hadoop_conf.S3A}.SimpleAWSCredentialsProvider",
        }
    # Other schemes keep their URL and get nothing.
    assert hadoop_conf.locate("file:///tmp/lake") == hadoop_conf.HadoopLocation("file:///tmp/lake")
    assert hadoop_conf.locate("gs://g/lake").conf == {}


def test_credentials_region_and_addressing_options() -> None:
    temp = hadoop_conf.locate("s3://b", {"key": "K", "secret": "S", "token": "T",
                                        "region": "r1"}).conf
    assert temp == {BUCKET + "access.key": "K", BUCKET + "secret.key": "S",
                    BUCKET + "session.token": "T", BUCKET + "endpoint.region": "r1",
                    BUCKET + "aws.credentials.provider":
                        f"{hadoop_conf.S3A}.TemporaryAWSCredentialsProvider"}
    # No credentials: S3A's own chain (environment, instance profile) applies.
    assert hadoop_conf.locate("s3://b", {}).conf == {}
    anon = hadoop_conf.locate("s3://b", {"anon": True}).conf
    assert anon == {BUCKET + "aws.credentials.provider":
                    f"{hadoop_conf.S3A}.AnonymousAWSCredentialsProvider"}
    virtual = hadoop_conf.locate("s3://b", {"endpoint_url": "https://s3.example",
                                            "config_kwargs": {"s3": {"addressing_style":
                                                                     "virtual"}}}).conf
    assert virtual[BUCKET + "path.style.access"] == "false"
    assert BUCKET + "connection.ssl.enabled" not in virtual
    with pytest.raises(ConfigError, match="only one of 'key' and 'secret'"):
        hadoop_conf.locate("s3://b", {"key": "K"})
    with pytest.warns(RuntimeWarning, match=r"profile, client_kwargs\.verify have no S3A"):
        hadoop_conf.locate("s3://b", {"profile": "p", "client_kwargs": {"verify": False},
                                      "txlog_client": "s3fs"})


class FakeHadoopConf(dict[str, str]):
    """What apply() touches of a SparkContext's Hadoop configuration."""

    def set(self, k: str, v: str) -> None:
        self[k] = v


def test_apply_sets_the_bucket_settings_and_warns_when_they_change() -> None:
    conf = FakeHadoopConf({"fs.s3a.bucket.other.endpoint": "http://elsewhere"})
    session = SimpleNamespace(sparkContext=SimpleNamespace(
        _jsc=SimpleNamespace(hadoopConfiguration=lambda: conf)))
    first = hadoop_conf.locate("s3://b.x/lake", {"key": "K", "secret": "S",
                                                 "endpoint_url": "http://127.0.0.1:9"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hadoop_conf.apply(session, first)  # type: ignore[arg-type]
        hadoop_conf.apply(session, first)  # type: ignore[arg-type]  # the same: no warning
    assert conf["fs.s3a.bucket.b.x.secret.key"] == "S"
    assert conf["fs.s3a.bucket.other.endpoint"] == "http://elsewhere"
    second = hadoop_conf.locate("s3://b.x/lake", {"key": "K", "secret": "S2",
                                                  "endpoint_url": "http://127.0.0.1:9"})
    with pytest.warns(RuntimeWarning, match=r"s3a://b\.x/lake: storage_options change "
                                            r"secret\.key from what") as caught:
        hadoop_conf.apply(session, second)  # type: ignore[arg-type]
    assert "S2" not in str(caught[0].message)  # names, never values
    assert conf["fs.s3a.bucket.b.x.secret.key"] == "S2"


# -- Spark ---------------------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.s3
def test_without_hadoop_aws_the_jvm_paths_name_the_jar(spark: Any,
                                                       seaweed: SeaweedServer) -> None:
    """The shared session has no hadoop-aws: the JVM read and write fail before any job
    with a ConfigError naming the jar that matches Spark's Hadoop."""
    url, options = seaweed.fresh_url("noaws"), seaweed.storage_options
    build(url, options, seed=8)
    version = spark.sparkContext._jvm.org.apache.hadoop.util.VersionInfo.getVersion()
    jar = rf"hadoop-aws-{version}\.jar.*org\.apache\.hadoop:hadoop-aws:{version}"
    with pytest.raises(ConfigError, match=rf"none for s3a://.*{jar}"):
        spark_ext.read(spark, url, topic="in", storage_options=options, engine="jvm")
    df = spark.createDataFrame([(b"k", b"v")], "key binary, value binary")
    with pytest.raises(ConfigError, match=jar):
        spark_ext.write(df, url, topic="out", storage_options=options, engine="jvm")
    assert consumed(url, options, "out") == []


@pytest.mark.spark
@pytest.mark.s3
@pytest.mark.slow
def test_jvm_scan_and_writer_on_s3_through_s3a(seaweed: SeaweedServer, tmp_path: Path) -> None:
    """A driver with hadoop-aws reads an s3:// root with the JVM scan and writes the rows
    to the same root addressed as s3a:// with the JVM writer, told the endpoint and
    credentials only through storage_options; txlog's consumer reads what was written."""
    jars = spark_procs.s3a_jars()
    if len(jars) < 3:
        pytest.skip("hadoop-aws and the AWS SDK are not in .jars/ (run scripts/fetch-jars.sh)")
    url, options = seaweed.fresh_url("s3a"), seaweed.storage_options
    expected = build(url, options, seed=32)
    out_url = "s3a://" + url.split("://", 1)[1]
    got = spark_procs.submit(["--master", "local[2]", "--jars", ",".join(map(str, jars)),
                              str(spark_procs.JOB), "jvm", url, out_url, "in", "out",
                              json.dumps(options)], tmp_path, name="s3a")
    assert "txlog planned scan" in got["plan"], got["plan"]
    assert got["endpoint"] == seaweed.endpoint
    assert [tuple(r) for r in got["rows"]] == expected
    assert [tuple(r) for r in got["sql_rows"]] == expected  # Spark's Parquet source too
    assert got["written"] == len(expected)
    out = consumed(url, options, "out")
    # Each row kept its partition; within one, the order of a write is Spark's.
    assert sorted((p, v) for p, _, v in out) == sorted((p, v) for p, _, v in expected)


@pytest.mark.spark
@pytest.mark.s3
@pytest.mark.slow
def test_format_txlog_on_s3_through_the_jvm_connector(seaweed: SeaweedServer,
                                                      tmp_path: Path) -> None:
    """format("txlog") alone, with the endpoint and credentials only in its
    storage_options option: the JVM connector reads an s3:// root with its scan, writes
    to the root addressed as s3a:// with its writer, and streams one topic into another
    (readStream/writeStream, maxOffsetsPerTrigger, AvailableNow), all through S3A."""
    jars = spark_procs.s3a_jars()
    if len(jars) < 3:
        pytest.skip("hadoop-aws and the AWS SDK are not in .jars/ (run scripts/fetch-jars.sh)")
    connector = spark_ext.connector_jar()
    assert connector is not None
    url, options = seaweed.fresh_url("fmt"), seaweed.storage_options
    expected = build(url, options, seed=33)
    txlog.connect(url, options).create_topic("streamed", partitions=2)
    out_url = "s3a://" + url.split("://", 1)[1]
    got = spark_procs.submit(["--master", "local[2]",
                              "--jars", ",".join(map(str, [*jars, connector])),
                              str(spark_procs.JOB), "format", url, out_url, "in", "out",
                              "streamed", json.dumps(options)], tmp_path, name="format")
    assert "txlog JVM scan" in got["plan"], got["plan"]
    assert got["endpoint"] == seaweed.endpoint  # set by the connector from storage_options
    assert [tuple(r) for r in got["rows"]] == expected
    out = consumed(url, options, "out")
    assert sorted((p, v) for p, _, v in out) == sorted((p, v) for p, _, v in expected)
    assert got["stream_sources"] == ["txlog JVM stream [topic=in]"], got["stream_sources"]
    assert "txlog JVM streaming write [topic=streamed]" in got["stream_plan"]
    assert got["stream_batches"] >= 2  # ten offsets per micro-batch
    streamed = consumed(url, options, "streamed")
    assert sorted(v for _, _, v in streamed) == sorted(v for _, _, v in expected)


@pytest.mark.spark
@pytest.mark.s3
@pytest.mark.slow
def test_scan_reads_each_object_with_one_signed_get(seaweed: SeaweedServer,
                                                    tmp_path: Path) -> None:
    """With static keys, an endpoint and a region, format("txlog") reads each committed
    batch object (a shared one too, which holds both partitions' rows) with one signed GET
    of its own and none through S3A (whose per-request
    CPU dominated the scan); with the signed GETs turned off, S3A reads them instead.
    A read soon after finds the objects in memory and sends no GET, unless nothing is
    kept. Every read returns txlog's consumer's rows; Spark's bytes read count each
    object once."""
    jars = spark_procs.s3a_jars()
    if len(jars) < 3:
        pytest.skip("hadoop-aws and the AWS SDK are not in .jars/ (run scripts/fetch-jars.sh)")
    connector = spark_ext.connector_jar()
    assert connector is not None
    url, options = seaweed.fresh_url("gets"), seaweed.storage_options
    expected = build(url, options, seed=34)
    ro = parse_read_options({"path": url, "topic": "in",
                             "storage_options": json.dumps(options)}, streaming=False)
    arrays = plan_batch(ro, ro.connect()).arrays
    objects = int(arrays.objects())
    # (a shared object holds both partitions' batches of a transaction: a slice each)
    sizes = dict(zip(arrays.key.to_pylist(), arrays.object_bytes.tolist(), strict=True))
    assert len(sizes) == objects
    got = spark_procs.submit(["--master", "local[2]",
                              "--jars", ",".join(map(str, [*jars, connector])),
                              str(spark_procs.JOB), "gets", url, "in", json.dumps(options)],
                             tmp_path, name="gets")
    for how in ("signed", "signed_again", "signed_unkept", "s3a", "s3a_again"):
        assert [tuple(r) for r in got[how]["rows"]] == expected, how
    assert got["signed"]["s3a_gets"] == 0, got
    assert got["s3a"]["signed_gets"] == 0, got
    assert got["signed"]["signed_gets"] == objects == got["s3a"]["s3a_gets"], (objects, got)
    # Read again, the objects come from memory; with nothing kept, from the store again.
    # The signed GETs' client and S3A's keep their own (as credentials would differ).
    assert got["signed_again"]["signed_gets"] == 0 == got["s3a_again"]["s3a_gets"], got
    assert got["signed_unkept"]["signed_gets"] == objects, got
    # Spark's bytes read count each object's bytes once (on the task's thread; S3A also
    # counts those it fetched ahead on the prefetch threads), from memory too.
    for how in ("signed", "signed_again", "signed_unkept"):
        assert got[how]["bytes_read"] == sum(sizes.values()), (how, got)
