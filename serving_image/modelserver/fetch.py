"""``python -m modelserver.fetch``: download a model from S3 (or an S3-compatible store) into a directory.

The init container of an ``s3://`` ModelDeployment::

    python -m modelserver.fetch --uri s3://bucket/prefix --dest /mnt/models [--sha256 HEX]
        [--timeout SECONDS] [--max-bytes N] [--cache-dir DIR --cache-max-bytes N
         [--cache-node-dir DIR --cache-node-max-bytes N --cache-namespace NS]]
        [--termination-log /dev/termination-log]

* ``s3://bucket/key`` naming one object: ``DEST/<basename of key>``; a prefix (``s3://bucket/dir``,
  ``s3://bucket/dir/``, ``s3://bucket``): the objects below it, with their relative paths, in ``DEST``.
* The download goes to a hidden staging directory next to (or inside) ``DEST`` and is moved into place only
  once every object is complete and verified: ``DEST`` then holds exactly the model (what was there before
  is replaced); a failed fetch leaves ``DEST`` as it was and no staging directory.
* ``--sha256``: for one object, the sha256 of its bytes; for a prefix, the directory digest of the
  downloaded tree (``python -m modelserver digest DIR`` on the uploaded directory prints it; see
  docs/server.md). Independently, each object is checked against the store: first its flexible checksum
  where the store has one (CRC64NVME, CRC32C, CRC32, SHA-256, SHA-1; combined from the ranges, or per
  upload part), else its ETag where that is a checksum (MD5 of a single-part object, MD5 of part MD5s of a
  multipart one); see :mod:`.s3_plan`.
* ``--max-bytes``: refuse (``TooLarge``) before downloading when the listed total is larger; a model larger
  than the free space where it goes is refused the same way.
* ``--timeout``: the wall-clock bound of the whole fetch (listing, waiting for another pod's download of the
  same model, downloading, verifying); besides, each request has connect/read timeouts and retries
  transient errors with exponential backoff.
* ``--cache-dir``: the node-local cache of this namespace (:mod:`modelserver.storage_cache`). A hit lists
  the object(s) (HEAD/LIST), reads no object data from the store, logs ``cache hit`` with the key, and
  copies the entry after checking every file against its record (:mod:`modelserver.cache_copy`); an entry
  that fails is dropped and downloaded again (``cache_corrupt``). ``--cache-node-dir``: the node-wide cap.

Logs are JSON lines on stdout (progress: bytes, rate, ETA). A failure exits non-zero and writes one line
``<Reason>: <message>`` to ``--termination-log`` (reasons and exit codes: :mod:`modelserver.fetch_errors`).
No credential appears in any output.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cache_copy import CorruptEntry, copy_verified
from .fetch_errors import (
    ChecksumMismatch,
    DownloadTimeout,
    FetchError,
    InvalidURI,
    TooLarge,
    redact,
)
from .storage_cache import Entry, NodeCache, rmtree
from .storage_s3 import (
    ClientOptions,
    FileDigest,
    Listing,
    Progress,
    S3Settings,
    TransferOptions,
    dir_digest_of,
    download,
    human,
    make_client,
    parse_s3_uri,
    resolve,
)

log = logging.getLogger("modelserver.fetch")

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_CACHE_MAX_BYTES = 100 << 30
STAGING = ".fetch-"
#: Kubernetes' default terminationMessagePath (the kubelet creates the file)
TERMINATION_LOG = "/dev/termination-log"


@dataclass
class FetchOptions:
    sha256: str = ""
    timeout: float = DEFAULT_TIMEOUT_S
    max_bytes: int = 0  # 0: no limit
    cache_dir: str = ""
    cache_max_bytes: int = DEFAULT_CACHE_MAX_BYTES
    #: node-wide accounting: the whole cache (every namespace's directory, read-only), its cap, and the
    #: name of this namespace's directory in it (``--cache-node-dir``; empty: none)
    cache_node_dir: str = ""
    cache_node_max_bytes: int = 0
    cache_namespace: str = ""
    progress_interval: float = 5.0
    client: ClientOptions = field(default_factory=ClientOptions)
    transfer: TransferOptions = field(default_factory=TransferOptions)


@dataclass
class FetchResult:
    dest: Path
    bytes: int
    files: int
    source: str  # "download" or "cache"
    cache_key: str | None
    sha256: str | None
    seconds: float


class _Run:
    """One fetch: its deadline, cancellation, and the staging directories to remove when it fails."""

    def __init__(self, timeout: float, cancelled: Callable[[], bool]) -> None:
        self.start = time.monotonic()
        self.deadline = self.start + timeout
        self.cancelled = cancelled
        self.staging: list[Path] = []
        self.lock = threading.Lock()

    def check(self) -> None:
        if self.cancelled():
            raise DownloadTimeout("cancelled")

    def track(self, p: Path) -> Path:
        with self.lock:
            self.staging.append(p)
        return p

    def cleanup(self) -> None:
        with self.lock:
            paths, self.staging = self.staging, []
        for p in paths:
            with contextlib.suppress(OSError):
                rmtree(p)


# ---------------------------------------------------------------------------------------------- destination


def _clean_stale(dest: Path) -> None:
    """Staging directories of a fetch that was killed (an init container restarted)."""
    candidates = list(dest.glob(STAGING + "*")) if dest.is_dir() else []
    if dest.parent.is_dir():
        candidates += list(dest.parent.glob(f".{dest.name}{STAGING}*"))
    for p in candidates:
        log.info("removing a stale staging directory", extra={"path": str(p)})
        rmtree(p)


def _staging_for(dest: Path, run: _Run) -> Path:
    if dest.exists() and not dest.is_dir():
        raise InvalidURI(f"--dest {dest} exists and is not a directory")
    if dest.is_dir():
        parent, prefix = dest, STAGING  # dest may be a mount point: stage inside it
    else:
        dest.parent.mkdir(parents=True, exist_ok=True)
        parent, prefix = dest.parent, f".{dest.name}{STAGING}"
    p = run.track(Path(tempfile.mkdtemp(prefix=prefix, dir=parent)))
    os.chmod(p, 0o755)
    return p


def _check_space(where: Path, size: int, uri: str) -> None:
    free = shutil.disk_usage(where).free
    if size > free:
        raise TooLarge(f"{uri} is {human(size)} ({size} bytes), more than the {human(free)} free at {where}")


def _readable(root: Path) -> None:
    """World-readable files and directories: the server may run as another user than the fetch."""
    for p in root.rglob("*"):
        if p.is_symlink():
            continue
        if p.is_dir():
            os.chmod(p, 0o755)
        else:
            os.chmod(p, 0o644)


def _place(staging: Path, dest: Path) -> None:
    """Make ``dest`` hold exactly the complete tree in ``staging`` (same filesystem: renames only)."""
    if not dest.exists():
        os.rename(staging, dest)  # atomic
        return
    for old in dest.iterdir():
        if old != staging and not old.name.startswith(STAGING):
            rmtree(old)
    for new in staging.iterdir():
        os.rename(new, dest / new.name)
    staging.rmdir()


# ---------------------------------------------------------------------------------------------- verification


def _digest(listing: Listing, digests: Mapping[str, FileDigest]) -> str | None:
    if any(digests[o.rel].sha256 is None for o in listing.objects):
        return None
    if listing.kind == "object":
        return digests[listing.objects[0].rel].sha256
    return dir_digest_of({o.rel: digests[o.rel].sha256 or "" for o in listing.objects})


def _check_sha256(uri: str, kind: str, got: str | None, expected: str, where: str = "") -> None:
    if not expected:
        return
    if got != expected.lower():
        what = "sha256" if kind == "object" else "directory digest (sha256, see docs/server.md)"
        raise ChecksumMismatch(f"{uri}: {what} {got}{where} does not match the expected {expected.lower()}")
    log.info("sha256 verified", extra={"event": "sha256_ok", "sha256": got})


# ---------------------------------------------------------------------------------------------- fetch


def fetch_model(
    uri: str,
    dest: str | Path,
    opts: FetchOptions | None = None,
    *,
    env: Mapping[str, str] | None = None,
    cancelled: Callable[[], bool] = lambda: False,
    _run: _Run | None = None,
) -> FetchResult:
    """Fetch ``uri`` (``s3://``) into ``dest``. Raises a :class:`FetchError` (typed by reason)."""
    opts = opts or FetchOptions()
    run = _run or _Run(opts.timeout, cancelled)
    try:
        return _fetch(uri, Path(dest).absolute(), opts, env, run)
    except BaseException:
        run.cleanup()
        raise


def _fetch(uri: str, dest: Path, opts: FetchOptions, env: Mapping[str, str] | None, run: _Run) -> FetchResult:
    loc = parse_s3_uri(uri)
    if opts.sha256 and not re.fullmatch(r"[0-9a-fA-F]{64}", opts.sha256):
        raise InvalidURI("--sha256 must be 64 hex digits")
    settings = S3Settings.from_env(env)
    endpoint = settings.describe()
    remaining = max(1.0, run.deadline - time.monotonic())
    copts = ClientOptions(
        connect_timeout=min(opts.client.connect_timeout, remaining),
        read_timeout=min(opts.client.read_timeout, remaining),
        max_attempts=opts.client.max_attempts,
        concurrency=opts.transfer.concurrency,
    )
    client = make_client(settings, copts)
    log.info(
        f"fetching {loc.uri} from {endpoint} into {dest}",
        extra={"event": "start", "uri": loc.uri, "endpoint": endpoint, "dest": str(dest)},
    )
    listing = resolve(client, loc, endpoint)
    run.check()
    total = listing.total_bytes
    log.info(
        f"listed {len(listing.objects)} object(s), {human(total)}",
        extra={
            "event": "listed",
            "kind": listing.kind,
            "objects": len(listing.objects),
            "total_bytes": total,
        },
    )
    if opts.max_bytes and total > opts.max_bytes:
        raise TooLarge(
            f"{loc.uri} is {human(total)} ({total} bytes), over the limit of {opts.max_bytes} bytes"
        )
    _clean_stale(dest)

    if opts.cache_dir:
        cached = _via_cache(client, listing, dest, opts, run, endpoint)
        if cached is not None:
            return cached
        # not cacheable (too large for the cap, or the cache is full of entries in use): a plain download

    staging = _staging_for(dest, run)
    _check_space(staging, total, loc.uri)
    digests = _download(client, listing, staging, opts, run, endpoint, want_sha256=bool(opts.sha256))
    digest = _digest(listing, digests)
    _check_sha256(loc.uri, listing.kind, digest, opts.sha256)
    _readable(staging)
    _place(staging, dest)
    return _done(dest, listing, "download", None, digest, run)


def _download(
    client: Any, listing: Listing, into: Path, opts: FetchOptions, run: _Run, endpoint: str, want_sha256: bool
) -> dict[str, FileDigest]:
    progress = Progress(listing.total_bytes, opts.progress_interval)
    log.info(
        f"downloading {human(listing.total_bytes)}",
        extra={"event": "download", "objects": len(listing.objects), "total_bytes": listing.total_bytes},
    )
    digests = download(
        client,
        listing,
        into,
        opts=opts.transfer,
        progress=progress,
        want_sha256=want_sha256,
        deadline=run.deadline,
        cancelled=run.cancelled,
        endpoint=endpoint,
    )
    progress.maybe_log(force=True)
    checked = sum(1 for d in digests.values() if d.verified)
    how = Counter(d.verified or "unchecked" for d in digests.values())
    log.info(
        f"store checksums verified for {checked} of {len(digests)} object(s)",
        extra={"event": "store_checksums", "verified": checked, "objects": len(digests), "checks": dict(how)},
    )
    return digests


def _node_cache(opts: FetchOptions) -> NodeCache:
    node = Path(opts.cache_node_dir) if opts.cache_node_dir else None
    return NodeCache(
        Path(opts.cache_dir), opts.cache_max_bytes, node, opts.cache_node_max_bytes, opts.cache_namespace
    )


def _hit(
    cache: NodeCache, entry: Entry, listing: Listing, dest: Path, opts: FetchOptions, run: _Run, **kw: Any
) -> FetchResult | None:
    """The entry copied into ``dest`` after its files passed :func:`copy_verified`; None when they did not
    (logged as ``cache_corrupt``; the caller drops the entry and downloads)."""
    log.info("cache hit", extra={"event": "cache_hit", "key": entry.key, "uri": listing.location.uri, **kw})
    try:
        return _from_cache(cache, entry, listing, dest, opts, run, "cache")
    except CorruptEntry as e:
        log.warning(
            f"cache entry {entry.key} is corrupt: {e}; downloading again",
            extra={"event": "cache_corrupt", "key": entry.key, "reason": str(e)},
        )
        run.cleanup()
        return None


def _via_cache(
    client: Any, listing: Listing, dest: Path, opts: FetchOptions, run: _Run, endpoint: str
) -> FetchResult | None:
    """The fetch through the node cache; None when the model is not cacheable (too large for the cap, or
    the cache is full of entries in use): the caller downloads it plainly."""
    cache = _node_cache(opts)
    loc = listing.location
    key = hashlib.sha256(json.dumps(listing.identity(endpoint), sort_keys=True).encode()).hexdigest()[:40]
    with cache.shared(key, run.deadline) as entry:
        res = _hit(cache, entry, listing, dest, opts, run) if entry is not None else None
        if res is not None:
            return res
    run.check()
    with cache.exclusive(key, run.deadline) as entry:
        if entry is not None:  # another pod filled it while we waited, or it failed its check
            res = _hit(cache, entry, listing, dest, opts, run, waited=True)
            if res is not None:
                return res
            cache.drop(key)
        log.info("cache miss", extra={"event": "cache_miss", "key": key, "uri": loc.uri})
        staging = cache.reserve(key, listing.total_bytes, run.deadline)
        if staging is None:
            return None
        run.track(staging)
        data = staging / "data"
        data.mkdir(mode=0o755)
        _check_space(staging, listing.total_bytes, loc.uri)
        digests = _download(client, listing, data, opts, run, endpoint, want_sha256=True)
        digest = _digest(listing, digests)
        _check_sha256(loc.uri, listing.kind, digest, opts.sha256)
        meta = {
            "uri": loc.uri,
            "endpoint": endpoint,
            "kind": listing.kind,
            "bytes": listing.total_bytes,
            "files": len(listing.objects),
            "sha256": digest,
            "objects": [[o.rel, o.size, o.etag] for o in listing.objects],
        }
        entry = cache.commit(key, staging, meta)
        return _from_cache(cache, entry, listing, dest, opts, run, "download")


def _from_cache(
    cache: NodeCache, entry: Entry, listing: Listing, dest: Path, opts: FetchOptions, run: _Run, source: str
) -> FetchResult:
    """Copy the entry into ``dest``, every file verified (:func:`copy_verified`; raises CorruptEntry)."""
    meta = entry.meta()
    recorded = meta.get("sha256")
    if recorded:  # a wrong expected sha256 is refused from the record, before any copy
        where = f" (cache entry {entry.key})"
        _check_sha256(listing.location.uri, listing.kind, recorded, opts.sha256, where)
    staging = _staging_for(dest, run)
    _check_space(staging, int(meta.get("bytes", 0)), listing.location.uri)
    learn = source == "download"  # the first copy after the fill (the key's lock is held exclusive)
    md5s = meta.get("md5Etags")
    if md5s is None and not learn:
        raise CorruptEntry("the entry records no MD5 ETags (filled by an older version)")
    digest, matched = copy_verified(entry.data, listing, recorded, md5s or [], staging, run.check, learn)
    if learn:
        entry.update_meta({**meta, "md5Etags": matched})
    _readable(staging)
    _place(staging, dest)
    cache.touch(entry.key)
    return _done(dest, listing, source, entry.key, digest, run)


def _done(
    dest: Path,
    listing: Listing,
    source: str,
    key: str | None,
    digest: str | None,
    run: _Run,
) -> FetchResult:
    secs = time.monotonic() - run.start
    res = FetchResult(dest, listing.total_bytes, len(listing.objects), source, key, digest, secs)
    log.info(
        f"fetched {listing.location.uri} into {dest}: {res.files} file(s), {human(res.bytes)} in {secs:.2f}s "
        f"({'cache' if source == 'cache' else 'download'})",
        extra={
            "event": "done",
            "source": source,
            "cache_key": key,
            "bytes": res.bytes,
            "files": res.files,
            "seconds": round(secs, 3),
            "sha256": digest,
        },
    )
    return res


# ---------------------------------------------------------------------------------------------- CLI


_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGTPE]i?|k)?[bB]?\s*$")
_MULT = {
    "": 1,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "Pi": 1 << 50,
    "Ei": 1 << 60,
}


def parse_size(text: str) -> int:
    """``1234``, ``500M``, ``10Gi`` (Kubernetes quantity suffixes) -> bytes."""
    m = _SIZE.match(str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (bytes, or with K/M/G/T or Ki/Mi/Gi/Ti)")
    return int(float(m.group(1)) * _MULT[m.group(2) or ""])


def _positive(kind: type) -> Callable[[str], Any]:
    def conv(text: str) -> Any:
        v = kind(text)
        if v <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
        return v

    return conv


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m modelserver.fetch",
        description="Download a model from S3 (or an S3-compatible store) into a directory.",
        epilog="S3 settings from the environment: S3_ENDPOINT, S3_USE_HTTPS, S3_VERIFY_SSL, AWS_CA_BUNDLE, "
        "AWS_DEFAULT_REGION, S3_ADDRESSING_STYLE; credentials AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (none: "
        "anonymous).",
    )
    p.add_argument("--uri", required=True, help="s3://bucket/key (one object) or s3://bucket/prefix[/]")
    p.add_argument(
        "--dest", required=True, help="the directory that receives the model (its content is replaced)"
    )
    p.add_argument("--sha256", default="", help="expected sha256 (one object) or directory digest (a prefix)")
    p.add_argument(
        "--timeout",
        type=_positive(float),
        default=DEFAULT_TIMEOUT_S,
        help="seconds for the whole fetch (default %(default)s)",
    )
    p.add_argument(
        "--max-bytes", type=parse_size, default=0, help="refuse a larger model (default: no limit)"
    )
    p.add_argument("--cache-dir", default="", help="node-local cache directory (default: no cache)")
    p.add_argument(
        "--cache-max-bytes",
        type=parse_size,
        default=DEFAULT_CACHE_MAX_BYTES,
        help="the cache's size cap; least recently used entries go first (default 100Gi)",
    )
    p.add_argument(
        "--cache-node-dir",
        default="",
        help="the whole node cache, one directory per namespace, read-only here: a fill that would take the "
        "node over --cache-node-max-bytes evicts this namespace's entries only, or is not cached",
    )
    p.add_argument("--cache-node-max-bytes", type=parse_size, default=0, help="the node-wide cap (0: none)")
    p.add_argument("--cache-namespace", default="", help="this namespace's directory in --cache-node-dir")
    p.add_argument(
        "--termination-log",
        default=TERMINATION_LOG,
        help="file for the one-line failure reason (default %(default)s, written only if it exists there)",
    )
    p.add_argument("--concurrency", type=_positive(int), default=10, help="concurrent requests (default 10)")
    p.add_argument(
        "--chunk-size",
        type=parse_size,
        default=8 << 20,
        help="ranged-GET size for large objects, also the threshold (default 8Mi, as boto3)",
    )
    p.add_argument("--connect-timeout", type=_positive(float), default=10.0, help="seconds (default 10)")
    p.add_argument("--read-timeout", type=_positive(float), default=60.0, help="seconds (default 60)")
    p.add_argument(
        "--max-attempts",
        type=_positive(int),
        default=5,
        help="attempts per request, with exponential backoff (default 5)",
    )
    p.add_argument(
        "--progress-interval", type=_positive(float), default=5.0, help="seconds between progress lines"
    )
    p.add_argument(
        "--etag-check",
        choices=("on", "off"),
        default="on",
        help="check each object against the store's checksums: its flexible checksum (CRC64NVME, CRC32C, "
        "CRC32, SHA-256, SHA-1) where it has one, else its ETag where that is an MD5 (default on)",
    )
    return p


def options_from_args(a: argparse.Namespace) -> FetchOptions:
    chunk = max(a.chunk_size, 5 << 20)
    return FetchOptions(
        sha256=a.sha256.strip().lower(),
        timeout=a.timeout,
        max_bytes=a.max_bytes,
        cache_dir=a.cache_dir,
        cache_max_bytes=a.cache_max_bytes,
        cache_node_dir=a.cache_node_dir,
        cache_node_max_bytes=a.cache_node_max_bytes,
        cache_namespace=a.cache_namespace,
        progress_interval=a.progress_interval,
        client=ClientOptions(a.connect_timeout, a.read_timeout, a.max_attempts, a.concurrency),
        transfer=TransferOptions(
            threshold=chunk, chunk_size=chunk, concurrency=a.concurrency, etag_check=a.etag_check == "on"
        ),
    )


class _RedactingFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        from .logs import JsonFormatter

        self.inner = JsonFormatter()

    def format(self, record: logging.LogRecord) -> str:
        return redact(self.inner.format(record))


def setup_logging(stream: Any = None) -> None:
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(_RedactingFormatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    for name in ("botocore", "boto3", "s3transfer", "urllib3"):
        logging.getLogger(name).setLevel(logging.WARNING)


def write_termination_log(path: str, line: str) -> None:
    if not path or (path == TERMINATION_LOG and not os.path.exists(path)):
        return  # the default outside a pod: no file to write, and none to create in /dev
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError as e:
        log.warning("cannot write the termination log", extra={"path": path, "error": e.strerror})


def main(argv: Sequence[str] | None = None) -> int:
    """Run the fetch; returns the exit code (0, or the failure's: :mod:`modelserver.fetch_errors`)."""
    setup_logging()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except InvalidURI as e:
        return _fail(e, _termination_log_arg(argv))
    opts = options_from_args(args)
    cancel = threading.Event()
    run = _Run(opts.timeout, cancel.is_set)
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["result"] = fetch_model(args.uri, args.dest, opts, cancelled=cancel.is_set, _run=run)
        except BaseException as e:
            box["error"] = e

    worker = threading.Thread(target=work, name="fetch", daemon=True)
    worker.start()
    # the hard bound: whatever a request does, the fetch ends at --timeout (plus a moment to clean up)
    worker.join(timeout=opts.timeout)
    if worker.is_alive():
        cancel.set()
        worker.join(timeout=2.0)
        run.cleanup()
        box["error"] = DownloadTimeout(f"{args.uri}: not fetched within --timeout {opts.timeout:g}s")
    err = box.get("error")
    if err is None:
        return 0
    if not isinstance(err, FetchError):
        log.error("unexpected error", extra={"exc": redact("".join(traceback.format_exception(err)))})
        err = FetchError(f"{args.uri}: {type(err).__name__}: {err}")
    return _fail(err, args.termination_log)


def _fail(err: FetchError, termination_log: str) -> int:
    line = err.line()
    log.error(line, extra={"event": "failed", "reason": err.reason, "exit_code": err.exit_code})
    write_termination_log(termination_log, line)
    print(line, file=sys.stderr, flush=True)
    return err.exit_code


def _termination_log_arg(argv: Sequence[str]) -> str:
    for i, a in enumerate(argv):
        if a == "--termination-log" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--termination-log="):
            return a.split("=", 1)[1]
    return TERMINATION_LOG


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise InvalidURI(f"invalid arguments: {message}")


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # threads of a cancelled download may still sit in a socket read: do not wait for them
    os._exit(code)
