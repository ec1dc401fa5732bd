"""Names must match in full (no trailing newline), and a root URL carrying credentials is
refused with an error that does not repeat them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import txlog
from txlog.errors import ConfigError, InvalidNameError
from txlog.names import validate_id, validate_topic

SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY"


@pytest.mark.parametrize("name", ["t\n", "t\r\n", "\nt", "t\n\n"])
def test_names_with_a_newline_are_refused(name: str) -> None:
    with pytest.raises(InvalidNameError):
        validate_topic(name)
    with pytest.raises(InvalidNameError):
        validate_id("transactional.id", name)
    with pytest.raises(InvalidNameError):
        txlog.connect("memory://names/nl").create_topic(name)


@pytest.mark.parametrize("url", [f"s3://AKIAEXAMPLE:{SECRET}@bucket/root",
                                 f"s3://{SECRET}@bucket",
                                 f"gs://user:{SECRET}@bucket/x",
                                 f"abfs://user:{SECRET}@account.dfs.core.windows.net/x",
                                 f"abfs://c@{SECRET}@account.dfs.core.windows.net/x",
                                 f"file://user:{SECRET}@host/tmp/x",
                                 f"s3://AKIA:{SECRET[:5]}@{SECRET[5:]}@bucket/x"])
def test_credentials_in_urls_are_refused_and_never_echoed(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        txlog.connect(url)
    msg = str(info.value)
    assert "credentials" in msg and "storage_options" in msg
    assert SECRET not in msg and SECRET[:5] not in msg and SECRET[5:] not in msg


def test_the_cli_never_prints_a_url_secret(tmp_path: Path) -> None:
    url = f"s3://AKIAEXAMPLE:{SECRET}@bucket/root"
    proc = subprocess.run([sys.executable, "-m", "txlog.cli", "--root", url, "topics", "list"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 1
    assert SECRET not in proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "credentials" in proc.stderr


@pytest.mark.parametrize("url", ["abfs://container@account.dfs.core.windows.net/x",
                                 "memory://no-userinfo/x"])
def test_urls_without_credentials_still_open(url: str) -> None:
    if url.startswith("abfs"):
        pytest.importorskip("adlfs")
    assert txlog.connect(url).url == url


def test_plain_paths_may_hold_at_signs(tmp_path: Path) -> None:
    root = tmp_path / "user:name@host"
    txlog.connect(str(root)).create_topic("t")
    assert txlog.connect(str(root)).list_topics() == ["t"]
