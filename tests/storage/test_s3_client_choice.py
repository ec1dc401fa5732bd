"""Which client serves an s3:// store: obstore when the storage options translate, s3fs
otherwise (pure: no server is contacted)."""

from __future__ import annotations

from typing import Any

import pytest

from txlog.errors import ConfigError
from txlog.storage import open_store
from txlog.storage.obstore_s3 import create_outcome, http_status, store_kwargs
from txlog.storage.remote import RemoteStore

ENDPOINT = {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000",
                              "region_name": "us-east-1"}}


@pytest.fixture(autouse=True)
def _no_aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for var in [v for v in os.environ if v.startswith("AWS_")]:
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize(("var", "value"), [
    ("AWS_ENDPOINT_URL", "http://elsewhere:9000"),  # botocore and obstore differ on it
    ("AWS_CONDITIONAL_PUT", "etag"),                 # obstore only
    ("AWS_SESSION_TOKEN", "from-env"),               # obstore would add it to the key
])
def test_environment_that_obstore_reads_differently_uses_s3fs(
        monkeypatch: pytest.MonkeyPatch, var: str, value: str) -> None:
    monkeypatch.setenv(var, value)
    assert store_kwargs({"key": "k", "secret": "s", **ENDPOINT}) is None


def test_shared_environment_keeps_obstore(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_PROFILE", "dev")
    monkeypatch.setenv("AWS_CA_BUNDLE", "/etc/ssl/certs/ca.pem")  # plain HTTP: unused
    assert store_kwargs({"key": "k", "secret": "s", **ENDPOINT}) is not None
    https = {"client_kwargs": {"endpoint_url": "https://s3.example", "region_name": "r"}}
    assert store_kwargs({"key": "k", "secret": "s", **https}) is None  # botocore's CAs
    monkeypatch.setenv("AWS_SESSION_TOKEN", "t")
    assert store_kwargs({**ENDPOINT}) is not None  # the token goes with the env's key


def test_keys_and_endpoint_translate() -> None:
    kw = store_kwargs({"key": "k", "secret": "s", "token": "t", **ENDPOINT})
    assert kw == {"region": "us-east-1", "endpoint": "http://127.0.0.1:9000",
                  "virtual_hosted_style_request": False, "access_key_id": "k",
                  "secret_access_key": "s", "token": "t",
                  "client_options": {"allow_http": True}, "unsigned_payload": True}


@pytest.mark.parametrize(("endpoint", "unsigned"), [
    (None, True),                           # AWS: HTTPS
    ("https://s3.example:9000", True),      # TLS protects the body
    ("http://127.0.0.1:9000", True),        # loopback: no network to cross
    ("http://localhost:9000", True),
    ("http://[::1]:9000", True),
    ("http://10.1.2.3:9000", False),        # plain HTTP over a network: signed
    ("http://minio.internal:9000", False),  # a name that may resolve anywhere
])
def test_payloads_are_signed_only_over_plain_http_networks(endpoint: str | None,
                                                             unsigned: bool) -> None:
    cfg: dict[str, Any] = {"region_name": "r"}
    if endpoint:
        cfg["endpoint_url"] = endpoint
    kw = store_kwargs({"key": "k", "secret": "s", "client_kwargs": cfg})
    assert kw is not None and kw["unsigned_payload"] is unsigned


def test_s3fs_tuning_options_do_not_stop_obstore() -> None:
    assert store_kwargs({"key": "k", "secret": "s", "use_listings_cache": False,
                         "default_block_size": 1 << 20, **ENDPOINT}) is not None


@pytest.mark.parametrize("options", [
    {"s3_additional_kwargs": {"ServerSideEncryption": "aws:kms"}},
    {"requester_pays": True},
    {"use_ssl": False},  # s3fs's plain-HTTP switch for AWS's own endpoints
    {"profile": "dev"},
    {"key": "k"},  # a key without its secret
    {"client_kwargs": {"endpoint_url": "http://h", "verify": "/etc/ca.pem"}},
    {"client_kwargs": {"endpoint_url": "http://h", "proxies": {"http": "p"}}},
])
def test_options_without_an_obstore_equivalent_use_s3fs(options: dict[str, Any]) -> None:
    assert store_kwargs({**ENDPOINT, **options} if "client_kwargs" not in options
                        else options) is None


def test_aws_without_a_region_uses_s3fs(monkeypatch: pytest.MonkeyPatch) -> None:
    assert store_kwargs({"key": "k", "secret": "s"}) is None  # s3fs looks the region up
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    kw = store_kwargs({})
    assert kw is not None and kw["region"] == "eu-west-1" and "endpoint" not in kw
    assert callable(kw["credential_provider"])  # botocore's chain, as s3fs would use


def test_anonymous_and_unverified() -> None:
    kw = store_kwargs({"anon": True, "client_kwargs": {
        "endpoint_url": "https://s3.local", "region_name": "r", "verify": False}})
    assert kw is not None and kw["skip_signature"] is True
    assert kw["client_options"] == {"allow_invalid_certificates": True}


def test_store_picks_its_client() -> None:
    opts = {"key": "k", "secret": "s", **ENDPOINT}
    default = open_store("s3://bucket/root", opts)
    assert isinstance(default, RemoteStore) and default.fast() is not None
    forced = open_store("s3://bucket/root", {**opts, "txlog_client": "s3fs"})
    assert isinstance(forced, RemoteStore) and forced.fast() is None
    assert "txlog_client" not in forced._fs_options  # never handed to s3fs
    sse = {**opts, "s3_additional_kwargs": {"ServerSideEncryption": "AES256"}}
    encrypted = open_store("s3://bucket/root", sse)
    assert isinstance(encrypted, RemoteStore) and encrypted.fast() is None


@pytest.mark.parametrize(("url", "options", "match"), [
    ("s3://bucket/root", {"txlog_client": "boto"}, "must be 'auto', 'obstore' or 's3fs'"),
    ("s3://bucket/root", {"txlog_client": "obstore", "requester_pays": True},
     "no obstore equivalent"),
    ("gs://bucket/root", {"txlog_client": "obstore"}, "s3:// stores only"),
])
def test_bad_client_choice_is_a_clear_error(url: str, options: dict[str, Any],
                                            match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        open_store(url, options)


@pytest.mark.parametrize(("message", "outcome"), [
    ("Server returned non-2xx status code: 409 Conflict: busy", "conflict"),
    ("Server returned non-2xx status code: 503 Slow Down: ", "ambiguous"),
    ("Server returned non-2xx status code: 403 Forbidden: ", "fatal"),
    ("Server returned non-2xx status code: 408 Request Timeout: ", "ambiguous"),
    ("Server returned non-2xx status code: 412 Precondition Failed: ", "lost"),
    ("Server returned non-2xx status code: 501 Not Implemented: ", "unsupported"),
    ("HTTP error: error sending request: connection reset", "ambiguous"),
    ("Server returned non-2xx status code: 301 Moved Permanently: ", "fatal"),
    ("Received redirect without LOCATION, this normally indicates an incorrectly "
     "configured region", "fatal"),
])
def test_obstore_errors_are_classified(message: str, outcome: str) -> None:
    from obstore.exceptions import GenericError

    exc = GenericError(f"Generic S3 error: Error performing PUT http://h/k in 1ms - {message}")
    assert create_outcome(exc) == outcome
    assert (http_status(exc) is None) == ("status code" not in message)


def test_a_409_reported_as_already_exists_is_a_conflict() -> None:
    """object_store raises a 409 ConditionalRequestConflict as AlreadyExistsError; the write
    was not applied, so it is retried, not settled as lost."""
    from obstore.exceptions import AlreadyExistsError

    exc = AlreadyExistsError("Object at location k already exists: Error performing PUT "
                             "http://h/k in 1ms - Server returned non-2xx status code: "
                             "409 Conflict: ConditionalRequestConflict")
    assert create_outcome(exc) == "conflict"
    assert create_outcome(AlreadyExistsError("Object at location k already exists")) == "lost"
