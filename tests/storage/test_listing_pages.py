"""S3 listings page to the end or fail: a ListObjectsV2 page that says more keys follow
but names no next token, or names one already followed, raises IncompleteListingError
instead of passing part of a listing off as all of it.  The paging rule is tested on
stubbed pages; the store's listings through each S3 client (obstore, s3fs) against a
loopback server that pages faultily.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from txlog.errors import IncompleteListingError, StorageError
from txlog.storage import open_store
from txlog.storage.listing import next_page_token
from txlog.storage.remote import RemoteStore
from txlog.testing.s3_list_stub import DEFAULT_PAGE, ListStub

BUCKET = "stub-bucket"
#: More than two server pages in one folder, so a repeated token is met on the second
#: page, by a listing and by a delimiter listing alike.
KEYS = [f"root/topics/t/0/log/000000/{i:012d}.json" for i in range(2 * DEFAULT_PAGE + 500)]


# --- the paging rule, on stubbed pages -------------------------------------------------


def test_pages_lead_on_until_one_is_not_truncated() -> None:
    seen: set[str] = set()
    assert next_page_token({"IsTruncated": True, "NextContinuationToken": "a"}, seen,
                           where="x") == "a"
    assert next_page_token({"IsTruncated": True, "NextContinuationToken": "b"}, seen,
                           where="x") == "b"
    # The last page ends the listing, whatever token it carries.
    assert next_page_token({"IsTruncated": False, "NextContinuationToken": "c"}, seen,
                           where="x") is None
    assert next_page_token({}, seen, where="x") is None
    assert seen == {"a", "b"}


@pytest.mark.parametrize("page", [{"IsTruncated": True},
                                  {"IsTruncated": True, "NextContinuationToken": ""},
                                  {"IsTruncated": True, "NextContinuationToken": None}])
def test_a_truncated_page_without_a_next_token_is_refused(page: dict[str, Any]) -> None:
    with pytest.raises(IncompleteListingError) as info:
        next_page_token(page, {"a"}, where="'log/' in s3://b/r")
    text = str(info.value)
    assert "'log/' in s3://b/r" in text and "page 2" in text
    assert "NextContinuationToken" in text and "Retry" in text
    assert isinstance(info.value, StorageError) and info.value.retriable


def test_a_next_token_already_followed_is_refused() -> None:
    seen: set[str] = set()
    assert next_page_token({"IsTruncated": True, "NextContinuationToken": "t1"}, seen,
                           where="x") == "t1"
    with pytest.raises(IncompleteListingError, match="already read"):
        next_page_token({"IsTruncated": True, "NextContinuationToken": "t1"}, seen,
                        where="x")


# --- the store's listings against a faulty server --------------------------------------


@pytest.fixture(params=["obstore", "s3fs"])
def client(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def stub_store(stub: ListStub, client: str) -> RemoteStore:
    store = open_store(f"s3://{BUCKET}/root",
                       {**stub.storage_options(), "txlog_client": client})
    assert isinstance(store, RemoteStore)
    assert (store.fast() is not None) == (client == "obstore")
    return store


@pytest.fixture
def stubs() -> Iterator[list[ListStub]]:
    made: list[ListStub] = []
    yield made
    for s in made:
        s.stop()


@pytest.mark.parametrize("fault", ["no-token", "repeat-token"])
def test_a_faulty_page_fails_the_listing(stubs: list[ListStub], client: str,
                                         fault: str) -> None:
    stub = ListStub(BUCKET, KEYS, fault=fault)
    stubs.append(stub)
    store = stub_store(stub, client)
    with pytest.raises(IncompleteListingError):
        got = store.list("topics/t/0/log/")
        print(f"{client}, {fault}: listed {len(got)} of {len(KEYS)} keys as complete")
    with pytest.raises(IncompleteListingError):
        store.list("topics/t/0/log/", start_after=KEYS[10][len("root/"):])
    with pytest.raises(IncompleteListingError):
        store.list_children("topics/t/0/log/000000/")


def test_a_listing_that_pages_correctly_is_whole(stubs: list[ListStub], client: str) -> None:
    stub = ListStub(BUCKET, KEYS)
    stubs.append(stub)
    store = stub_store(stub, client)
    n = len("root/")
    assert store.list("topics/t/0/log/") == [k[n:] for k in KEYS]
    after = KEYS[10][n:]
    assert store.list("topics/t/0/log/", start_after=after) == [k[n:] for k in KEYS[11:]]
    assert store.list_children("topics/t/0/log/") == ["000000"]
    assert store.list_children("topics/t/0/log/000000/") == [k.rpartition("/")[2] for k in KEYS]


def test_a_listing_of_one_page_is_one_request(stubs: list[ListStub], client: str) -> None:
    # A faulty server still answers short listings whole: they never reach its paging.
    stub = ListStub(BUCKET, KEYS[:5], fault="no-token")
    stubs.append(stub)
    store = stub_store(stub, client)
    store.check_bucket()
    before = stub.requests
    assert store.list("topics/t/0/log/") == [k[len("root/"):] for k in KEYS[:5]]
    assert stub.requests - before == 1
