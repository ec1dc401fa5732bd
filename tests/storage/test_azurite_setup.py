"""Azurite comes from the set-up command (scripts/bootstrap.sh), pinned, into this checkout's
``.tools/azurite``: the test helpers only look for it, never install it, and say how to get
it when it is missing or of another version."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from txlog.testing import servers


def _fake_install(prefix: Path, version: str) -> Path:
    exe = prefix / "node_modules" / ".bin" / "azurite-blob"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    meta = prefix / "node_modules" / "azurite" / "package.json"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"name": "azurite", "version": version}))
    return exe


@pytest.fixture
def no_azurite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No Azurite anywhere, an ``npm`` on PATH that records being run, and the variable that
    once let the helpers install it set."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "npm-calls"
    for tool in ("npm", "node"):
        fake = bin_dir / tool
        fake.write_text(f'#!/bin/sh\necho "{tool} $*" >> "{calls}"\nexit 1\n')
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin")
    assert shutil.which("azurite-blob") is None
    monkeypatch.setenv("TXLOG_TEST_INSTALL_AZURITE", "1")
    monkeypatch.setenv("TXLOG_TEST_CACHE", str(tmp_path / "cache"))
    prefix = tmp_path / "checkout" / ".tools" / "azurite"
    monkeypatch.setattr(servers, "azurite_prefix", lambda: prefix, raising=False)
    return calls


def test_a_missing_azurite_is_not_installed_and_the_reason_names_the_setup(
        no_azurite: Path) -> None:
    assert servers.find_azurite() is None
    assert not no_azurite.exists(), "the helpers ran npm: " + no_azurite.read_text()
    reason = servers.azure_unavailable_reason()
    assert reason is not None
    assert "scripts/bootstrap.sh" in reason
    assert not no_azurite.exists()


def test_azurite_of_another_version_is_not_used(no_azurite: Path) -> None:
    _fake_install(servers.azurite_prefix(), "3.0.0")
    assert servers.find_azurite() is None
    reason = servers.azure_unavailable_reason()
    assert reason is not None
    assert "3.0.0" in reason and servers.AZURITE_VERSION in reason
    assert "scripts/bootstrap.sh" in reason
    assert not no_azurite.exists()


def test_the_pinned_azurite_the_setup_installed_is_found(no_azurite: Path) -> None:
    exe = _fake_install(servers.azurite_prefix(), servers.AZURITE_VERSION)
    assert servers.find_azurite() == str(exe)


@pytest.mark.skipif(shutil.which("npm") is None, reason="no npm here: the set-up skips Azurite")
def test_the_setup_installed_the_pinned_azurite_in_this_checkout() -> None:
    have = servers.installed_azurite_version(servers.azurite_prefix())
    assert have == servers.AZURITE_VERSION, (
        f"Azurite {have} in {servers.azurite_prefix()}: run scripts/bootstrap.sh")
