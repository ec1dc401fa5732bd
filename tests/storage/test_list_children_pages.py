"""Delimiter listings (``list_children``) and listings that take many pages, on real
servers with a page size of 3: SeaweedFS (a root at the bucket itself, and one under a
path) and Azurite (a root at the container).  A sweep of the state log finds the
partitions in use through ``list_children``; a name lost at a page boundary would hide a
partition's transactions from it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from txlog.state_log import StateLog
from txlog.storage import open_store
from txlog.storage.remote import RemoteStore

PAGE = 3
#: State-log partitions in use: more than a few pages of names, 3 and 4 digits mixed.
PARTITIONS = [0, 1, 7, 49, 99, 100, 101, 512, 999, 1000, 1001, 2048, 4095]
KEYS = sorted(
    [f"_txn/state/{p:03d}/log/000000/{s:012d}.json" for p in PARTITIONS for s in (0, 1)]
    + ["_txn/state/007/checkpoints/000000000200.json", "_txn/pid-blocks/000000000000.json",
       "_meta/topics/a.json", "_meta/topics/b.json", "_meta/settings.json"]
    + [f"topics/t/{p}/log/000000/000000000000.json" for p in range(8)])


def fill(store: RemoteStore) -> None:
    for k in KEYS:
        store.put(k, b"{}")


def check_listings(store: RemoteStore) -> None:
    assert store.list_children("") == ["_meta", "_txn", "topics"]
    assert store.list_children("_txn/") == ["pid-blocks", "state"]
    assert store.list_children("_txn/state/") == sorted(f"{p:03d}" for p in PARTITIONS)
    assert store.list_children("_txn/state/007/") == ["checkpoints", "log"]
    assert store.list_children("topics/t/") == [str(p) for p in range(8)]
    assert store.list_children("_meta/topics/") == ["a.json", "b.json"]
    assert store.list("") == KEYS
    assert store.list("_txn/state/") == [k for k in KEYS if k.startswith("_txn/state/")]
    after = "_txn/state/099/log/000000/000000000000.json"
    assert store.list("_txn/state/", start_after=after) == [
        k for k in KEYS if k.startswith("_txn/state/") and k > after]
    assert StateLog(store, 4096).used_partitions() == PARTITIONS
    # A root of fewer partitions owns only its own: the rest are another root's names.
    assert StateLog(store, 1000).used_partitions() == [p for p in PARTITIONS if p < 1000]


# --- S3 (SeaweedFS) --------------------------------------------------------------------


def small_s3_pages(store: RemoteStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make s3fs's ListObjectsV2 requests ask for PAGE keys a page; returns a list that
    gets one entry per page (the keys and prefixes on it)."""
    fs = store.fsspec()
    real = fs.call_s3
    pages: list[int] = []

    def call_s3(method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "list_objects_v2":
            kwargs["MaxKeys"] = PAGE
            page = real(method, *args, **kwargs)
            pages.append(len(page.get("Contents", ())) + len(page.get("CommonPrefixes", ())))
            return page
        return real(method, *args, **kwargs)

    monkeypatch.setattr(fs, "call_s3", call_s3)
    return pages


@pytest.fixture
def fresh_bucket(seaweed: Any) -> Iterator[str]:
    """A bucket of its own, so a root at the bucket itself starts empty."""
    name = f"pages-{uuid.uuid4().hex[:10]}"
    admin = open_store(seaweed.url, dict(seaweed.storage_options, txlog_client="s3fs"))
    assert isinstance(admin, RemoteStore)
    admin.fsspec().call_s3("create_bucket", Bucket=name)
    yield name


@pytest.mark.s3
@pytest.mark.parametrize("client", ["s3", "s3fs"])
@pytest.mark.parametrize("where", ["bucket-root", "under-a-path"])
def test_s3_listings_in_pages_of_3(seaweed: Any, fresh_bucket: str, client: str,
                                   where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"s3://{fresh_bucket}" if where == "bucket-root" else f"s3://{fresh_bucket}/a/b"
    options = dict(seaweed.storage_options,
                   txlog_client="obstore" if client == "s3" else "s3fs")
    store = open_store(url, options)
    assert isinstance(store, RemoteStore)
    assert store.prefix == ("" if where == "bucket-root" else "a/b/")
    fill(store)
    if where == "under-a-path":  # a neighbour outside the root, sorting inside its range
        open_store(f"s3://{fresh_bucket}/a/b-other", options).put("_txn/x", b"{}")
    pages = small_s3_pages(store, monkeypatch)
    check_listings(store)
    print(f"{client} at {where}: {len(pages)} pages of at most {PAGE}")
    assert pages and max(pages) <= PAGE and pages.count(PAGE) > 10


# --- Azure (Azurite) -------------------------------------------------------------------


@pytest.fixture
def fresh_container(azurite: Any) -> Iterator[str]:
    name = f"pages-{uuid.uuid4().hex[:10]}"
    admin = open_store(azurite.url, azurite.storage_options)
    assert isinstance(admin, RemoteStore)
    admin.fsspec().mkdir(name)
    yield name


def small_azure_pages(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make adlfs's listings ask Azure for PAGE names a page; returns a list that gets
    one entry per page (the blobs and prefixes on it)."""
    from azure.storage.blob.aio import ContainerClient
    from azure.storage.blob.aio._list_blobs_helper import BlobPropertiesPaged

    pages: list[int] = []
    real_walk, real_list = ContainerClient.walk_blobs, ContainerClient.list_blobs
    real_extract = BlobPropertiesPaged._extract_data_cb

    def walk_blobs(self: Any, *args: Any, **kwargs: Any) -> Any:
        return real_walk(self, *args, **{**kwargs, "results_per_page": PAGE})

    def list_blobs(self: Any, *args: Any, **kwargs: Any) -> Any:
        return real_list(self, *args, **{**kwargs, "results_per_page": PAGE})

    async def extract(self: Any, get_next_return: Any) -> Any:
        got = await real_extract(self, get_next_return)
        segment = self._response.segment
        pages.append(len(segment.blob_items) + len(getattr(segment, "blob_prefixes", None)
                                                   or ()))
        return got

    monkeypatch.setattr(ContainerClient, "walk_blobs", walk_blobs)
    monkeypatch.setattr(ContainerClient, "list_blobs", list_blobs)
    monkeypatch.setattr(BlobPropertiesPaged, "_extract_data_cb", extract)
    return pages


def test_azure_listings_in_pages_of_3(azurite: Any, fresh_container: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(f"abfs://{fresh_container}", azurite.storage_options)
    assert isinstance(store, RemoteStore)
    fill(store)
    pages = small_azure_pages(monkeypatch)
    check_listings(store)
    print(f"azure at the container root: {len(pages)} pages of at most {PAGE}")
    assert pages and max(pages) <= PAGE and pages.count(PAGE) > 10
