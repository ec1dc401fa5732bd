"""Shared pytest fixtures.

Sections (fixtures used by one folder only live in that folder's conftest.py, e.g. the
Spark session in tests/spark/conftest.py):

* storage servers: ``seaweed`` (S3, session-scoped, started on first use), ``azurite``.
* stores: ``store_factory`` (make a fresh store of any backend), ``any_store``
  (parametrized over every backend), ``shared_store`` (backends that other processes
  can see: local, s3, azure).

Backends can be narrowed with ``TXLOG_TEST_BACKENDS=memory,local`` (comma-separated).
Servers start only when a test needs them, so memory/local-only runs need no server.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from txlog.storage import ObjectStore, open_store
from txlog.testing import servers

# --- storage servers --------------------------------------------------------------

# gcsfs (2026.10) asks GCS's gRPC control plane for every bucket's layout first, which
# fake-gcs-server does not serve (the client retries over TLS until its timeout): the
# plain JSON-API client, as gcsfs used before.  Read when gcsfs is imported.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


#: "s3" is SeaweedFS through txlog's default client (obstore); "s3fs" the same server
#: through s3fs, the client for options obstore cannot serve and for forked children.
ALL_BACKENDS = ["memory", "local", "s3", "s3fs", "gcs", "azure"]
#: Backends whose objects other processes see (the memory store is per process).
SHARED_BACKENDS = ["local", "s3", "s3fs", "gcs", "azure"]


def _selected(backends: list[str]) -> list[str]:
    wanted = os.environ.get("TXLOG_TEST_BACKENDS")
    if not wanted:
        return backends
    names = {b.strip() for b in wanted.split(",") if b.strip()}
    return [b for b in backends if b in names]


def require_backend(backend: str) -> None:
    """Skip the calling test/fixture if TXLOG_TEST_BACKENDS leaves ``backend`` out."""
    if not _selected([backend]):
        pytest.skip(f"backend {backend!r} not in TXLOG_TEST_BACKENDS")


def _backend_params(backends: list[str]) -> list[Any]:
    marks = {"s3": [pytest.mark.s3], "s3fs": [pytest.mark.s3], "gcs": [pytest.mark.gcs]}
    return [pytest.param(b, id=b, marks=marks.get(b, [])) for b in _selected(backends)]


@pytest.fixture(scope="session")
def seaweed() -> Iterator[servers.SeaweedServer]:
    """A SeaweedFS S3 server for the whole session.

    ``.url`` is ``s3://txlog-test``, ``.storage_options`` the fsspec/s3fs options,
    ``.fresh_url(name)`` a unique URL under the bucket, ``.endpoint`` the HTTP endpoint.
    """
    require_backend("s3")
    try:
        server = servers.start_seaweed()
    except servers.ServerUnavailable as exc:
        pytest.skip(f"SeaweedFS unavailable: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def fake_gcs() -> Iterator[servers.FakeGcsServer]:
    """fake-gcs-server for the session (skips when it or gcsfs is not installed)."""
    require_backend("gcs")
    reason = servers.gcs_unavailable_reason()
    if reason:
        pytest.skip(f"GCS backend unavailable: {reason}")
    server = servers.start_fake_gcs()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def azurite() -> Iterator[servers.AzuriteServer]:
    """An Azurite blob server for the session (skips when Azurite or adlfs is missing)."""
    require_backend("azure")
    reason = servers.azure_unavailable_reason()
    if reason:
        pytest.skip(f"Azure backend unavailable: {reason}")
    server = servers.start_azurite()
    try:
        yield server
    finally:
        server.stop()


# --- stores -------------------------------------------------------------------------


class StoreFactory:
    """Makes fresh stores at unique roots: ``store_factory("s3")``, ``.url("local")``."""

    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self._request = request
        self._tmp_path = tmp_path

    def url(self, backend: str, name: str = "t") -> tuple[str, dict[str, Any]]:
        """(url, storage_options) of a fresh, empty location for ``backend``."""
        require_backend(backend)
        unique = f"{name}-{uuid.uuid4().hex[:12]}"
        if backend == "memory":
            return f"memory://txlog-tests/{unique}", {}
        if backend == "local":
            return str(self._tmp_path / unique), {}
        if backend in ("s3", "s3fs"):
            server = self._request.getfixturevalue("seaweed")
            client = "obstore" if backend == "s3" else "s3fs"
            return server.fresh_url(name), dict(server.storage_options, txlog_client=client)
        if backend == "gcs":
            gcs = self._request.getfixturevalue("fake_gcs")
            return gcs.fresh_url(name), dict(gcs.storage_options)
        if backend == "azure":
            server = self._request.getfixturevalue("azurite")
            return server.fresh_url(name), dict(server.storage_options)
        raise ValueError(f"unknown test backend {backend!r}")

    def __call__(self, backend: str, name: str = "t") -> ObjectStore:
        url, options = self.url(backend, name)
        return open_store(url, options)


@pytest.fixture
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """``store_factory(backend, name="t") -> ObjectStore`` at a fresh unique root;
    ``store_factory.url(backend, name="t") -> (url, storage_options)``."""
    return StoreFactory(request, tmp_path)


@pytest.fixture(params=_backend_params(ALL_BACKENDS))
def any_store(request: pytest.FixtureRequest, store_factory: StoreFactory) -> ObjectStore:
    """A fresh, empty store; the test runs once per backend (memory, local, s3, azure)."""
    return store_factory(request.param)


@pytest.fixture(params=_backend_params(SHARED_BACKENDS))
def shared_store(request: pytest.FixtureRequest, store_factory: StoreFactory) -> ObjectStore:
    """A fresh store that other processes can see (local, s3, azure)."""
    return store_factory(request.param)


@pytest.fixture
def gates() -> Iterator[list[Any]]:
    """Test gates (objects with ``open()``) that hold a thread inside a store call; every
    one is opened at the end, so no background thread is left blocked."""
    made: list[Any] = []
    yield made
    for g in made:
        g.open()

