"""The parallel download of a listing (s3transfer, ranged GETs under one concurrency bound), each
object checked by its plan, with the overall deadline and cancellation."""

from __future__ import annotations

import functools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .fetch_errors import (
    ChecksumMismatch,
    DownloadTimeout,
    FetchError,
)
from .fetch_progress import Progress
from .s3_errors import map_error
from .s3_listing import Listing, RemoteObject
from .s3_plan import Plan, TransferOptions, head_checksum, plan_objects
from .s3_stream import StreamHashes
from .s3_verify import FileDigest, hash_file, md5_mismatch, verify_file
from .store_checksums import (
    StoreChecksum,
    combined,
)

log = logging.getLogger("modelserver.fetch")


def _expected_checksum(client: Any, bucket: str, plan: Plan, hashes: StreamHashes) -> StoreChecksum | None:
    """The store's value for a "flex" plan: from the listing's HEAD, the GET's answer, or a HEAD now; read
    with the plan's kind where the store did not say it (moto, for one, gives a COMPOSITE value without its
    "-N")."""
    obj = plan.obj
    got = plan.expected or hashes.value(bucket, obj.key)
    if got is None:
        got = head_checksum(client, bucket, obj, plan.algorithm)
    if got is None or (got.kind and not (plan.kind == "COMPOSITE" and not got.parts)):
        return got
    if plan.kind == "COMPOSITE" and plan.part_sizes:
        value = got.value if got.parts else f"{got.value}-{len(plan.part_sizes)}"
        return StoreChecksum(got.algorithm, "COMPOSITE", value)
    return StoreChecksum(got.algorithm, "FULL_OBJECT", got.value)


def _verify(
    client: Any, bucket: str, plan: Plan, path: Path, hashes: StreamHashes, want_sha256: bool
) -> FileDigest:
    obj = plan.obj
    where = f"s3://{bucket}/{obj.key}"
    if path.stat().st_size != obj.size:
        raise ChecksumMismatch(f"{where}: {path.stat().st_size} bytes on disk, the store listed {obj.size}")
    sha = None
    if want_sha256:
        sha, _, _ = hash_file(path, None, True, False)
    if plan.check == "flex":
        expected = _expected_checksum(client, bucket, plan, hashes)
        ranges = hashes.ranges(bucket, obj.key)
        got = combined(expected, ranges, obj.size, plan.part_sizes) if expected is not None else None
        if expected is not None and got is not None:
            if got == expected.value:
                return FileDigest(sha, expected.algorithm.lower() + ("-composite" if expected.parts else ""))
            # a store may word its checksum otherwise than we read it: the ETag decides, read again
            d = verify_file(client, bucket, obj, path, want_sha256=False)
            if not d.verified:
                raise ChecksumMismatch(
                    f"{where}: {expected.algorithm} {got} of the bytes does not match the store's checksum "
                    f"{expected.value}"
                )
            log.warning(
                f"{expected.algorithm} {expected.value} of the store not understood; the ETag matched",
                extra={"object": where},
            )
            return FileDigest(sha, d.verified)
        # no value in the answer, or ranges that do not make it (a retried range): the ETag, re-read
        d = verify_file(client, bucket, obj, path, want_sha256=False)
        return FileDigest(sha, d.verified)
    if plan.check in ("md5", "multipart"):
        got = hashes.etag_of(bucket, obj.key, plan.part_sizes if plan.check == "multipart" else None)
        if got == obj.etag.lower():
            return FileDigest(sha, "etag-md5" if plan.check == "md5" else "etag-multipart")
        if got is not None and plan.check == "md5":
            return md5_mismatch(client, bucket, obj, where, sha, got)
        # the streams did not cover the parts one to one (a retried range, parts of unequal sizes): re-read
    if plan.check == "off":
        return FileDigest(sha, "")
    if plan.check == "none":
        if obj.etag:
            log.warning("ETag is not a checksum: store checksum not checked", extra={"object": where})
        return FileDigest(sha, "")
    d = verify_file(client, bucket, obj, path, want_sha256=False)
    return FileDigest(sha, d.verified)


@functools.cache
def _subscriber_class() -> type[Any]:
    """s3transfer's subscriber for one object (imported on first use, as boto3 is: the server imports
    this package without fetching anything): size and ETag from the listing (no HEAD per object, and
    ranged GETs carry If-Match), progress counted, the finished future posted to ``events``."""
    from s3transfer.subscribers import BaseSubscriber

    class Subscriber(BaseSubscriber):
        def __init__(self, obj: RemoteObject, progress: Progress, events: queue.Queue[Any]) -> None:
            self.obj, self.progress, self.events = obj, progress, events

        def on_queued(self, future: Any, **kwargs: Any) -> None:
            future.meta.provide_transfer_size(self.obj.size)
            if self.obj.etag:
                future.meta.provide_object_etag(f'"{self.obj.etag}"')

        def on_progress(self, future: Any, bytes_transferred: int, **kwargs: Any) -> None:
            self.progress.add(bytes_transferred)

        def on_done(self, future: Any, **kwargs: Any) -> None:
            self.events.put(future)

    return Subscriber


def _groups(plans: list[Plan], opts: TransferOptions) -> list[tuple[int | None, list[Plan]]]:
    """The plans by ranged-GET size (None: one GET whatever the size), smallest first; an object below
    the chunk size joins that group (one GET there too), so it needs no manager of its own."""
    groups: dict[int | None, list[Plan]] = {}
    for plan in plans:
        key = plan.chunk
        if key is None and plan.obj.size < opts.chunk_size:
            key = opts.chunk_size
        groups.setdefault(key, []).append(plan)
    return sorted(groups.items(), key=lambda kv: kv[0] or 0)


def _transfer_config(chunk: int | None, opts: TransferOptions) -> Any:
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(
        # None: one GET whatever the size
        multipart_threshold=chunk if chunk is not None else (1 << 62),
        multipart_chunksize=chunk or opts.chunk_size,
        max_concurrency=opts.concurrency,
        num_download_attempts=opts.stream_attempts,
        max_io_queue=1000,
        preferred_transfer_client="classic",
    )


@dataclass
class _Run:
    """One download's shared state: what it reads from, where it writes, and what has finished."""

    client: Any
    listing: Listing
    into: Path
    progress: Progress
    want_sha256: bool
    deadline: float
    cancelled: Callable[[], bool]
    endpoint: str
    hashes: StreamHashes
    hasher: ThreadPoolExecutor
    # finished downloads and checks, as they finish: no polling interval between a transfer's end and its
    # check, or between one group and the next
    events: queue.Queue[Any] = field(default_factory=queue.Queue)
    hashing: dict[Future[FileDigest], RemoteObject] = field(default_factory=dict)
    digests: dict[str, FileDigest] = field(default_factory=dict)

    @property
    def bucket(self) -> str:
        return self.listing.location.bucket

    def mapped(self, e: BaseException, obj: RemoteObject) -> FetchError:
        return map_error(e, f"s3://{self.bucket}/{obj.key}", self.endpoint)

    def start(self, manager: Any, plans: list[Plan]) -> dict[Any, Plan]:
        pending: dict[Any, Plan] = {}
        for plan in plans:
            target = self.into / plan.obj.rel
            target.parent.mkdir(parents=True, exist_ok=True)
            extra = {"VersionId": plan.obj.version_id} if plan.obj.version_id else {}
            sub = _subscriber_class()(plan.obj, self.progress, self.events)
            fut = manager.download(
                self.bucket, plan.obj.key, str(target), extra_args=extra, subscribers=[sub]
            )
            pending[fut] = plan
        return pending

    def finish(self, pending: dict[Any, Plan]) -> None:
        """Waits for ``pending`` transfers, handing each finished one to a check."""
        while pending:
            _tick(self.listing, self.deadline, self.cancelled)
            done = _next_event(self.events)
            if done is None:
                # no word for a while: look at the transfers themselves too (a done callback that was
                # never called must not leave the fetch waiting for its deadline)
                done = next((f for f in pending if f.done()), None)
            if done in pending:
                plan = pending.pop(done)
                try:
                    done.result()
                except Exception as e:
                    raise self.mapped(e, plan.obj) from e
                path = self.into / plan.obj.rel
                hf = self.hasher.submit(
                    _verify, self.client, self.bucket, plan, path, self.hashes, self.want_sha256
                )
                self.hashing[hf] = plan.obj
                hf.add_done_callback(self.events.put)
            _collect(self.hashing, self.digests, self.mapped)
            self.progress.maybe_log()

    def checks(self) -> None:
        """Waits for the checks still running."""
        while self.hashing:
            _tick(self.listing, self.deadline, self.cancelled)
            _next_event(self.events)
            _collect(self.hashing, self.digests, self.mapped)


def download(
    client: Any,
    listing: Listing,
    into: Path,
    *,
    opts: TransferOptions,
    progress: Progress,
    want_sha256: bool,
    deadline: float,
    cancelled: Callable[[], bool] = lambda: False,
    endpoint: str = "",
) -> dict[str, FileDigest]:
    """Download every object of ``listing`` below ``into`` (which exists), checking each against the store's
    checksum; the sha256 of each file when ``want_sha256``. Raises a :class:`FetchError`.

    Objects go in groups of equal ranged-GET size (one s3transfer TransferManager each, one group after the
    other, so that ``opts.concurrency`` bounds the requests in flight). Each range is hashed as it streams:
    with the store's flexible checksum where it has one we compute (a FULL_OBJECT CRC is combined from
    ranges of any size; a COMPOSITE one needs one range per upload part), else with MD5 for the ETag (a
    multipart object's ranges are its upload parts; a single-part object up to ``single_stream_max``
    comes in one GET whose MD5 is its ETag)."""
    from boto3.s3.transfer import create_transfer_manager

    bucket = listing.location.bucket
    try:
        plans = plan_objects(client, bucket, listing.objects, opts)
    except Exception as e:
        raise map_error(e, listing.location.uri, endpoint) from e
    hashes = StreamHashes()
    if opts.etag_check:
        hashes.install(client)
        for plan in plans:
            if plan.check == "flex":
                hashes.use(bucket, plan.obj.key, plan.algorithm)
    hasher = ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1)), thread_name_prefix="verify")
    run = _Run(client, listing, into, progress, want_sha256, deadline, cancelled, endpoint, hashes, hasher)
    ok = False
    manager = None
    try:
        for chunk, members in _groups(plans, opts):
            manager = create_transfer_manager(client, _transfer_config(chunk, opts))
            run.finish(run.start(manager, members))
            manager.shutdown()
            manager = None
        run.checks()
        ok = True
    finally:
        if opts.etag_check:
            hashes.uninstall(client)
        hasher.shutdown(wait=ok, cancel_futures=True)
        if manager is not None:
            # cancel what runs; threads blocked in a read end at the read timeout: do not wait for them
            threading.Thread(target=manager.shutdown, kwargs={"cancel": True}, daemon=True).start()
    return run.digests


def _next_event(events: queue.Queue[Any], timeout: float = 0.1) -> Any:
    """The next finished transfer or check; None after ``timeout`` (the deadline and cancellation are
    checked at least that often)."""
    try:
        return events.get(timeout=timeout)
    except queue.Empty:
        return None


def _tick(listing: Listing, deadline: float, cancelled: Callable[[], bool]) -> None:
    if cancelled():
        raise DownloadTimeout(f"{listing.location.uri}: cancelled")
    if time.monotonic() > deadline:
        raise DownloadTimeout(f"{listing.location.uri}: not complete before the deadline")


def _collect(
    hashing: dict[Any, RemoteObject],
    digests: dict[str, FileDigest],
    mapped: Callable[[BaseException, RemoteObject], FetchError],
) -> None:
    for hf in [f for f in hashing if f.done()]:
        obj = hashing.pop(hf)
        try:
            digests[obj.rel] = hf.result()
        except Exception as e:
            raise mapped(e, obj) from e
