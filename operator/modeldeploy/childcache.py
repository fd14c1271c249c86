"""The children of every ModelDeployment, in memory: what a reconcile observes instead of LISTing.

kopf already watches the children (Deployments, Services, PDBs, Pods and, optionally, HTTPRoutes labelled
``modeldeploy.io/name``) to enqueue their owner. Index handlers (``@kopf.index``, see
:func:`modeldeploy.operator.build_registry`) keep each of them under ``(namespace, owner)``; kopf fills the
indices from its initial listing *before* it runs any other handler, so the first reconcile already sees
every child, and it drops an object's entry when the object is deleted.

Two things the indices alone would get wrong:

* **Threads.** kopf changes the indices in the event loop; reconciles run in worker threads. A reconcile
  reads a snapshot taken in the loop (:meth:`ChildCache.children`).
* **Our own writes.** The watch event of an object the operator has just applied arrives a few
  milliseconds later; a reconcile in between would see the old object and write again. The answers to
  our writes are laid over the indices (:meth:`wrote`, :meth:`gone`) until the watch has caught up (the
  indexed object's ``resourceVersion`` is at least the written one, or the deleted object is gone), or
  for :data:`OVERLAY_TTL` seconds at most.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .builders import LABEL_NAME
from .kube import ResourceType

#: an overlay entry the watch never confirmed (e.g. the object was changed by someone else in between)
#: is dropped after this long
OVERLAY_TTL = 60.0
SNAPSHOT_TIMEOUT = 30.0

Key = tuple[str, str]  # (namespace, ModelDeployment name)
ObjKey = tuple[str, str, str]  # (kind, namespace, name)


def index_key(namespace: str | None, labels: Mapping[str, str]) -> Key | None:
    owner = labels.get(LABEL_NAME)
    return (namespace, owner) if namespace and owner else None


def trimmed(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the cache keeps of a child: the object without ``metadata.managedFields`` (nothing here reads
    them, and they are most of a Deployment's bytes: copied at every reconcile, kept for every child)."""
    out = dict(obj)
    meta = out.get("metadata")
    if isinstance(meta, Mapping) and "managedFields" in meta:
        out["metadata"] = {key: v for key, v in meta.items() if key != "managedFields"}
    return out


def _rv(obj: Mapping[str, Any] | None) -> int | None:
    try:
        return int((obj or {}).get("metadata", {}).get("resourceVersion"))
    except (TypeError, ValueError):
        return None


@dataclass
class _Overlay:
    obj: dict[str, Any] | None  # None: deleted by us
    rv: int | None  # the written object's resourceVersion; for a deletion, the deleted object's uid matters
    uid: str | None
    owner: str | None
    at: float


def merge(indexed: Iterable[dict[str, Any]], overlay: Mapping[str, _Overlay]) -> list[dict[str, Any]]:
    """The indexed objects of one kind and owner with our newer writes laid over them (pure).
    ``overlay`` maps object names to what we wrote."""
    out: dict[str, dict[str, Any]] = {}
    for obj in indexed:
        name = obj.get("metadata", {}).get("name", "")
        out[name] = obj
    for name, ov in overlay.items():
        have = out.get(name)
        if ov.obj is None:
            if have is not None and (ov.uid is None or have.get("metadata", {}).get("uid") == ov.uid):
                del out[name]
            continue
        have_rv, ov_rv = _rv(have), ov.rv
        if have is None or (have_rv is not None and ov_rv is not None and ov_rv > have_rv):
            out[name] = ov.obj
    return [out[n] for n in sorted(out)]


def confirmed(indexed: Mapping[str, dict[str, Any]], name: str, ov: _Overlay) -> bool:
    """Whether the watch has caught up with an overlay entry (so it can go)."""
    have = indexed.get(name)
    if ov.obj is None:
        return have is None or (ov.uid is not None and have.get("metadata", {}).get("uid") != ov.uid)
    have_rv = _rv(have)
    return have_rv is not None and ov.rv is not None and have_rv >= ov.rv


class ChildCache:
    """kopf's child indices, read from worker threads, with the operator's writes laid over them."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._indices: dict[str, Mapping[Key, Iterable[Mapping[str, Any]]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._overlay: dict[ObjKey, _Overlay] = {}
        self._lock = threading.Lock()
        self._clock = clock

    def attach(self, loop: asyncio.AbstractEventLoop, indices: Mapping[str, Any]) -> None:
        """Called in the loop (a kopf startup handler) with ``{kind: kopf index}``."""
        self._loop = loop
        self._indices = dict(indices)

    def serves(self, kind: str) -> bool:
        return self._loop is not None and kind in self._indices

    # -------------------------------------------------------------------------------- reads
    def _indexed(self, kind: str, key: Key) -> list[dict[str, Any]]:
        """In the loop: a deep copy of the indexed objects (the reconcile may keep them)."""
        store = self._indices[kind].get(key) or ()
        return [copy.deepcopy(dict(v)) for v in store]

    def children(self, rt: ResourceType, namespace: str, owner: str) -> list[dict[str, Any]]:
        """The children of one kind of ``namespace/owner``, as a LIST would return them (from a thread)."""
        loop = self._loop
        assert loop is not None, "ChildCache.children before attach"

        async def snapshot() -> list[dict[str, Any]]:
            return self._indexed(rt.kind, (namespace, owner))

        indexed = asyncio.run_coroutine_threadsafe(snapshot(), loop).result(SNAPSHOT_TIMEOUT)
        by_name = {o.get("metadata", {}).get("name", ""): o for o in indexed}
        now = self._clock()
        with self._lock:
            mine: dict[str, _Overlay] = {}
            for okey, ov in list(self._overlay.items()):
                kind, ns, name = okey
                if kind != rt.kind or ns != namespace or ov.owner != owner:
                    continue
                if confirmed(by_name, name, ov) or now - ov.at > OVERLAY_TTL:
                    del self._overlay[okey]
                    continue
                mine[name] = ov
        out = merge(indexed, mine)
        for obj in out:
            obj.setdefault("apiVersion", rt.api_version)
            obj.setdefault("kind", rt.kind)
        return out

    # -------------------------------------------------------------------------------- our writes
    def wrote(self, obj: Mapping[str, Any]) -> None:
        """The apiserver's answer to our write of a child (apply or patch)."""
        kind, meta = obj.get("kind"), obj.get("metadata") or {}
        if not isinstance(kind, str) or kind not in self._indices or not meta.get("namespace"):
            return
        owner = (meta.get("labels") or {}).get(LABEL_NAME)
        with self._lock:
            self._overlay[(kind, meta["namespace"], meta["name"])] = _Overlay(
                copy.deepcopy(trimmed(obj)), _rv(obj), meta.get("uid"), owner, self._clock()
            )

    def gone(self, kind: str, namespace: str, name: str, uid: str | None, owner: str) -> None:
        """We deleted a child of ``owner`` (or found it gone)."""
        if kind not in self._indices:
            return
        with self._lock:
            self._overlay[(kind, namespace, name)] = _Overlay(None, None, uid, owner, self._clock())
