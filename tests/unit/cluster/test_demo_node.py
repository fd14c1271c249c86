"""Where ``make demo``'s pods run (``DEMO_NODE``, else the real node when the serving image's archive is
there and we are root, else the agent with the reason) and what a MiniLM pod asks for on each."""

from __future__ import annotations

from pathlib import Path

import pytest
from localcluster import demo_node, nodeimages
from localcluster.demo_node import NodeChoice, choose_node, fit_minilm, writer_resources


@pytest.fixture
def archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A serving-image archive that find_archives lists (the file exists; its contents are not read)."""
    tar = tmp_path / "modeldeploy-modelserver-dev-0-zstd.tar"
    tar.write_bytes(b"")
    found = [nodeimages.ImageArchive(demo_node.SERVER_IMAGE, tar)]
    monkeypatch.setattr(nodeimages, "find_archives", lambda: (found, "a test manifest"))
    monkeypatch.setattr(demo_node.os, "geteuid", lambda: 0)
    return tar


def test_the_real_node_is_the_default_with_the_image_as_root(archive: Path) -> None:
    choice = choose_node({})
    assert choice.node == "containerd" and choice.real
    assert "a test manifest" in choice.why and "DEMO_NODE=agent" in choice.why


@pytest.mark.parametrize("value", ["agent", "process", " Agent "])
def test_demo_node_agent_picks_the_agent(archive: Path, value: str) -> None:
    assert choose_node({"DEMO_NODE": value}).node == "process"


def test_without_the_image_the_agent_and_why(archive: Path) -> None:
    archive.unlink()
    choice = choose_node({})
    assert choice.node == "process" and "make images" in choice.why
    with pytest.raises(SystemExit, match="make images"):
        choose_node({"DEMO_NODE": "containerd"})


def test_not_root_the_agent(archive: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo_node.os, "geteuid", lambda: 1000)
    assert choose_node({}).node == "process"
    with pytest.raises(SystemExit, match="root"):
        choose_node({"DEMO_NODE": "containerd"})


def test_an_unknown_value_is_refused(archive: Path) -> None:
    with pytest.raises(SystemExit, match="DEMO_NODE"):
        choose_node({"DEMO_NODE": "kind"})


def test_minilm_resources_on_the_real_node_only() -> None:
    doc = {"spec": {"resources": {"gpu": 1, "cpu": "1", "memory": "2Gi"}}}
    fit_minilm(doc, NodeChoice("process", ""))
    assert doc["spec"]["resources"] == {"gpu": 1, "cpu": "1", "memory": "2Gi"}
    fit_minilm(doc, NodeChoice("containerd", ""))
    assert doc["spec"]["resources"] == {"cpu": "250m", "memory": "2Gi"}
    assert writer_resources(NodeChoice("containerd", ""))["cpu"] == "500m"
    assert writer_resources(NodeChoice("process", ""))["cpu"] == "1"


def test_lock_holders_reads_proc_locks(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    lock.touch()
    ino = lock.stat().st_ino
    text = (
        f"1: FLOCK  ADVISORY  WRITE 4242 fd:01:{ino} 0 EOF\n"
        f"1: -> FLOCK  ADVISORY  WRITE 4343 fd:01:{ino} 0 EOF\n"  # a waiter
        "2: POSIX  ADVISORY  WRITE 99 fd:01:1 0 EOF\n"
    )
    assert demo_node.lock_holders(lock, text) == {4242}


def test_the_lock_is_taken_on_the_real_node_and_passed_through_under_a_caller_holding_it(
    tmp_path: Path,
) -> None:
    import fcntl
    import os

    lock = tmp_path / "lock"
    with demo_node.real_node_lock(NodeChoice("containerd", ""), lock):
        fd = os.open(lock, os.O_RDWR)
        with pytest.raises(BlockingIOError):  # held for the demo
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(fd)
    # a caller (here this process: an ancestor of itself) holds it: the demo goes on without waiting
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with demo_node.real_node_lock(NodeChoice("containerd", ""), lock):
            pass
    finally:
        os.close(fd)
