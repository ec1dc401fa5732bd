"""A remote root whose bucket or container does not exist is refused at its first
request, for reading and for writing, with an error that names the bucket; it never
reads as an empty root, and nothing creates the bucket (SeaweedFS makes one on a first
PUT)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from typing import Any

import pytest

import txlog
from txlog.errors import BucketNotFoundError, RootNotFoundError

BACKENDS = [pytest.param("s3", marks=pytest.mark.s3), pytest.param("s3fs", marks=pytest.mark.s3),
            "azure"]


def missing_root(request: pytest.FixtureRequest, backend: str) -> tuple[str, dict[str, Any]]:
    """A URL under a bucket (container) nobody created, and working storage options."""
    bucket = f"no-such-{uuid.uuid4().hex[:10]}"
    if backend == "azure":
        server = request.getfixturevalue("azurite")
        return f"abfs://{bucket}/root", dict(server.storage_options)
    server = request.getfixturevalue("seaweed")
    client = "obstore" if backend == "s3" else "s3fs"
    return f"s3://{bucket}/root", dict(server.storage_options, txlog_client=client)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reading_a_root_in_a_missing_bucket_is_refused(request: pytest.FixtureRequest,
                                                       backend: str) -> None:
    url, options = missing_root(request, backend)
    bucket = url.split("://")[1].split("/")[0]
    log = txlog.connect(url, options, create=False)
    with pytest.raises(BucketNotFoundError, match=f"'{bucket}' does not exist") as err:
        log.list_topics()
    assert isinstance(err.value, RootNotFoundError)
    assert "create the" in str(err.value)
    with pytest.raises(BucketNotFoundError):
        txlog.connect(url, options).consumer(group_id="g").committed([txlog.TopicPartition("t", 0)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_writing_a_root_in_a_missing_bucket_is_refused_and_creates_nothing(
        request: pytest.FixtureRequest, backend: str) -> None:
    url, options = missing_root(request, backend)
    with pytest.raises(BucketNotFoundError, match="does not exist"):
        txlog.connect(url, options).create_topic("t")
    with pytest.raises(BucketNotFoundError):
        txlog.connect(url, options).producer().send("t", b"x")
    # Nothing made the bucket meanwhile: a new client is refused the same way.
    with pytest.raises(BucketNotFoundError):
        txlog.connect(url, options, create=False).list_topics()


@pytest.mark.s3
def test_the_command_line_says_which_bucket_is_missing(request: pytest.FixtureRequest) -> None:
    url, options = missing_root(request, "s3")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXLOG_")}
    env["TXLOG_STORAGE_OPTIONS"] = json.dumps(options)
    p = subprocess.run([sys.executable, "-m", "txlog.cli", "--root", url, "topics", "list"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 1, p.stderr
    assert p.stderr.startswith("txlog: error: no txlog root at ") and "does not exist" in \
        p.stderr and p.stderr.count("\n") == 1, p.stderr


@pytest.mark.s3
def test_an_existing_bucket_is_checked_once_per_process(store_factory: Any) -> None:
    store = store_factory("s3", "bucket")
    store.list("_meta/")
    again = txlog.connect(store.url, store.storage_options).store
    again.list("_meta/")
    assert "bucket" not in again.counter.snapshot()["requests"]
