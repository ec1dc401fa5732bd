"""Hostile roots: what someone who can write into a txlog root (or a server that lies)
can make txlog do.  Links in a local root, entries naming other partitions' objects,
hostile metadata, settings that must agree across clients, flipped bits, and a server
that ignores the atomic create's condition.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import txlog
from txlog.errors import LinkInRootError
from txlog.storage import beneath, open_store


@pytest.fixture(params=["openat2", "walk"])
def resolve(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways the local store refuses links: one openat2 call, or a walk of openat
    calls (kernels before 5.6, sandboxes without openat2)."""
    if request.param == "openat2" and not beneath.use_openat2:
        pytest.skip("no openat2 here")
    if request.param == "walk":
        monkeypatch.setattr(beneath, "use_openat2", False)
    return str(request.param)


def _outside(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    (victim / "0" / "data").mkdir(parents=True)
    (victim / "precious").write_bytes(b"keep me")
    (victim / "0" / "data" / "x.parquet").write_bytes(b"keep me too")
    return victim


def _untouched(victim: Path) -> None:
    assert (victim / "precious").read_bytes() == b"keep me"
    assert (victim / "0" / "data" / "x.parquet").read_bytes() == b"keep me too"
    assert sorted(p.name for p in (victim / "0" / "data").iterdir()) == ["x.parquet"]


# --- links in a local root -------------------------------------------------------------


def test_delete_topic_through_a_linked_topic_directory_stays_in_the_root(
        tmp_path: Path, resolve: str) -> None:
    victim = _outside(tmp_path)
    lg = txlog.connect(str(tmp_path / "root"))
    lg.create_topic("t")
    with lg.producer() as p:
        p.send("t", b"v")
    os.rename(tmp_path / "root" / "topics" / "t", tmp_path / "moved")
    os.symlink(victim, tmp_path / "root" / "topics" / "t")
    with pytest.raises(LinkInRootError, match="symbolic link"):
        txlog.connect(str(tmp_path / "root")).delete_topic("t")
    _untouched(victim)


def test_a_linked_data_directory_receives_no_batch_object(tmp_path: Path,
                                                          resolve: str) -> None:
    victim = _outside(tmp_path)
    lg = txlog.connect(str(tmp_path / "root"))
    lg.create_topic("t")
    (tmp_path / "root" / "topics" / "t" / "0").mkdir(parents=True, exist_ok=True)
    os.symlink(victim / "0" / "data", tmp_path / "root" / "topics" / "t" / "0" / "data")
    with pytest.raises(LinkInRootError), lg.producer() as p:
        p.send("t", b"v").result()
    _untouched(victim)


def test_store_calls_never_follow_a_link(tmp_path: Path, resolve: str) -> None:
    victim = _outside(tmp_path)
    store = open_store(str(tmp_path / "root"))
    store.put("a/b/real", b"mine")
    os.symlink(victim, tmp_path / "root" / "a" / "dirlink")
    os.symlink(victim / "precious", tmp_path / "root" / "a" / "b" / "filelink")
    # A link is listed as a key (so it can be deleted), never descended into.
    assert store.list("a/") == ["a/b/filelink", "a/b/real", "a/dirlink"]
    with pytest.raises(LinkInRootError):
        store.list("a/dirlink/")
    for call in (lambda: store.get("a/b/filelink"), lambda: store.size("a/b/filelink"),
                 lambda: store.get_range("a/b/filelink", 0, 3),
                 lambda: store.get("a/dirlink/precious"),
                 lambda: store.put("a/dirlink/new", b"x"),
                 lambda: store.put_new("a/dirlink/0/data/new", b"x"),
                 lambda: store.put_if_absent("a/dirlink/new", b"x"),
                 lambda: store.put_if_absent("a/dirlink/sub/new", b"x"),
                 lambda: store.delete("a/dirlink/precious")):
        with pytest.raises(LinkInRootError):
            call()
    # Deleting a link removes the link, never what it names.
    store.delete("a/b/filelink")
    store.delete("a/dirlink")
    assert store.list("a/") == ["a/b/real"]
    _untouched(victim)
    assert store.get("a/b/real") == b"mine"


def test_a_directory_swapped_for_a_link_after_first_use_is_refused(
        tmp_path: Path, resolve: str) -> None:
    """The store keeps directory descriptors between writes; a directory replaced by a
    link meanwhile is noticed, not written through."""
    victim = _outside(tmp_path)
    store = open_store(str(tmp_path / "root"))
    store.put_if_absent("t/0/data/a", b"1")
    os.rename(tmp_path / "root" / "t", tmp_path / "moved")
    os.symlink(victim, tmp_path / "root" / "t")
    with pytest.raises(LinkInRootError):
        store.put_if_absent("t/0/data/b", b"2")
    with pytest.raises(LinkInRootError):
        store.put_new("t/0/data/c", b"3")
    _untouched(victim)


def test_the_root_itself_may_be_a_link(tmp_path: Path, resolve: str) -> None:
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "root")
    lg = txlog.connect(str(tmp_path / "root"))
    lg.create_topic("t")
    with lg.producer() as p:
        p.send("t", b"v")
    with lg.consumer(auto_offset_reset="earliest") as c:
        c.assign(lg.partitions_for("t"))
        assert [r.value for r in c.poll(timeout_ms=0)] == [b"v"]
