"""The children of every ModelDeployment, in memory: what a reconcile observes instead of LISTing.

kopf already watches the children (Deployments, Services, PDBs, Pods and, optionally, HTTPRoutes labelled
``modeldeploy.io/name``) to enqueue their owner. Index handlers (``@kopf.index``, see
:func:`modeldeploy.operator.build_registry`) keep each of them under ``(namespace, owner)``; kopf fills the
indices from its initial listing *before* it runs any other handler, so the first reconcile already sees
every child, and it drops an object's entry when the object is deleted.

Three things the indices alone would get wrong:

* **Threads.** kopf changes the indices in the event loop; reconciles run in worker threads. A reconcile
  reads a snapshot taken in the loop (:meth:`ChildCache.children`).
* **Our own writes.** The watch event of an object the operator has just applied arrives a few
  milliseconds later; a reconcile in between would see the old object and write again. The answers to
  our writes are laid over the indices (:meth:`wrote`, :meth:`gone`) until the watch has caught up (the
  indexed object's ``resourceVersion`` is at least the written one, or the deleted object is gone), or
  for :data:`OVERLAY_TTL` seconds at most.
* **Lost deletions.** kopf drops an entry only on a DELETED watch event: a child deleted while the watch
  was broken (a 410 relist, an apiserver restart, a partition) would stay in the index for good, and the
  reconcile would never recreate it. A periodic LIST (:mod:`modeldeploy.resync`) hands its answer to
  :meth:`ChildCache.resynced`, which hides the indexed objects the LIST proves gone and shows the listed
  ones the index lacks (a :class:`Repair`, replaced by the next LIST).
"""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .builders import LABEL_NAME
from .kube import ResourceType

#: an overlay entry the watch never confirmed (e.g. the object was changed by someone else in between)
#: is dropped after this long
OVERLAY_TTL = 60.0
SNAPSHOT_TIMEOUT = 30.0
#: a listed object the index lacked is shown this long at most: the watch normally delivers it within
#: seconds (kopf relists after an outage), and one deleted between the LIST and the resync must not linger
ADDED_TTL = OVERLAY_TTL

Key = tuple[str, str]  # (namespace, ModelDeployment name)
ObjKey = tuple[str, str, str]  # (kind, namespace, name)
Identity = tuple[str, str | None]  # (name, uid) of an indexed object


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


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return (obj or {}).get("metadata") or {}


@dataclass
class Repair:
    """What the last LIST of one kind says that the index does not. Replaced whole by the next LIST, so it
    never holds more than one listing's worth.

    ``hidden``: per owner, the indexed objects the LIST proved gone, ``(name, uid)`` -> the indexed
    resourceVersion hidden (the same uid at a newer one shows again). ``added``: per owner, the listed
    objects the index lacks or holds older, by name, until the watch delivers them or :data:`ADDED_TTL`
    has passed since ``at``."""

    hidden: dict[Key, dict[Identity, int]] = field(default_factory=dict)
    added: dict[Key, dict[str, dict[str, Any]]] = field(default_factory=dict)
    at: float = 0.0


def supersedes(have: Mapping[str, Any] | None, listed: Mapping[str, Any]) -> bool:
    """Whether the indexed object ``have`` is at least as new as a listed one of the same name, so the
    listed one is not shown. An unknown resourceVersion on either side trusts the watch."""
    if have is None:
        return False
    have_rv, listed_rv = _rv(have), _rv(listed)
    return have_rv is None or listed_rv is None or have_rv >= listed_rv


def repaired(
    indexed: Iterable[dict[str, Any]], hidden: Mapping[Identity, int], added: Mapping[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """The indexed objects of one kind and owner as the last LIST says they are (pure): without those it
    proved gone, with those it saw that the index lacks or holds older (by name, in no order)."""
    out: dict[str, dict[str, Any]] = {}
    for obj in indexed:
        meta, rv = _meta(obj), _rv(obj)
        gone_rv = hidden.get((meta.get("name", ""), meta.get("uid")))
        if gone_rv is not None and rv is not None and rv <= gone_rv:
            continue
        out[meta.get("name", "")] = obj
    for name, obj in added.items():
        if not supersedes(out.get(name), obj):
            out[name] = obj
    return list(out.values())


def _view(indexed: Sequence[dict[str, Any]], repair: Repair, key: Key) -> set[tuple[Any, ...]]:
    objs = repaired(indexed, repair.hidden.get(key, {}), repair.added.get(key, {}))
    return {(m.get("name"), m.get("uid"), m.get("resourceVersion")) for m in map(_meta, objs)}


def changed_views(
    indexed_by_key: Mapping[Key, Sequence[dict[str, Any]]], before: Repair, after: Repair
) -> set[Key]:
    """The owners whose children look different under ``after`` than under ``before`` (pure): those a
    reconcile must look at again. Only an owner one of them repairs can differ."""
    keys = {*before.hidden, *before.added, *after.hidden, *after.added}
    return {
        key
        for key in keys
        if _view(indexed_by_key.get(key, ()), before, key) != _view(indexed_by_key.get(key, ()), after, key)
    }


def reconcile_listing(
    indexed_by_key: Mapping[Key, Sequence[dict[str, Any]]],
    listed: Iterable[Mapping[str, Any]],
    listed_rv: int | None,
    before: Repair | None = None,
    now: float = 0.0,
) -> tuple[Repair, set[Key]]:
    """What a LIST of one kind (every object with our label in the watched scope, taken at ``listed_rv``)
    repairs in that kind's index, and the owners whose view differs from the one ``before`` gave (pure).

    An indexed object is hidden when the LIST lacks it (same namespace, name, uid and owner) and its
    resourceVersion is at most ``listed_rv``: it existed when the LIST was taken, so it was deleted (or
    lost our label) and the watch missed it. One newer than the LIST, or of an unknown resourceVersion
    (``listed_rv`` None included), is never hidden. A listed object is added unless an indexed object of
    the same namespace and name is as new (:func:`supersedes`): the watch missed its creation or change."""
    listing: dict[tuple[str, str], tuple[Key, Mapping[str, Any]]] = {}
    for obj in listed:
        meta = _meta(obj)
        key = index_key(meta.get("namespace"), meta.get("labels") or {})
        if key is not None:
            listing[(key[0], meta.get("name", ""))] = (key, obj)
    repair = Repair(at=now)
    same_name: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for key, objs in indexed_by_key.items():
        for obj in objs:
            meta, rv = _meta(obj), _rv(obj)
            name = meta.get("name", "")
            same_name.setdefault((key[0], name), []).append(obj)
            there = listing.get((key[0], name))
            kept = there is not None and there[0] == key and _meta(there[1]).get("uid") == meta.get("uid")
            if listed_rv is not None and rv is not None and rv <= listed_rv and not kept:
                repair.hidden.setdefault(key, {})[(name, meta.get("uid"))] = rv
    for (ns, name), (key, obj) in listing.items():
        if not any(supersedes(have, obj) for have in same_name.get((ns, name), ())):
            repair.added.setdefault(key, {})[name] = copy.deepcopy(trimmed(obj))
    return repair, changed_views(indexed_by_key, before or Repair(), repair)


def _identity(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What a resync needs of an indexed object (no copy of the whole index)."""
    meta = _meta(obj)
    return {"metadata": {f: meta.get(f) for f in ("name", "uid", "resourceVersion")}}


class ChildCache:
    """kopf's child indices, read from worker threads, with the operator's writes laid over them."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._indices: dict[str, Mapping[Key, Iterable[Mapping[str, Any]]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._overlay: dict[ObjKey, _Overlay] = {}
        self._repairs: dict[str, Repair] = {}  # kind -> what its last resync repaired
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
        now = self._clock()
        with self._lock:
            view = self._repaired(rt.kind, (namespace, owner), indexed, now)
            by_name = {o.get("metadata", {}).get("name", ""): o for o in view}
            mine: dict[str, _Overlay] = {}
            for okey, ov in list(self._overlay.items()):
                kind, ns, name = okey
                if kind != rt.kind or ns != namespace or ov.owner != owner:
                    continue
                if confirmed(by_name, name, ov) or now - ov.at > OVERLAY_TTL:
                    del self._overlay[okey]
                    continue
                mine[name] = ov
        out = merge(view, mine)
        for obj in out:
            obj.setdefault("apiVersion", rt.api_version)
            obj.setdefault("kind", rt.kind)
        return out

    def _repaired(
        self, kind: str, key: Key, indexed: list[dict[str, Any]], now: float
    ) -> list[dict[str, Any]]:
        """Under the lock: one owner's indexed children as the last resync says they are. Drops the
        additions the watch has since delivered (or older than :data:`ADDED_TTL`); copies the rest."""
        repair = self._repairs.get(kind)
        if repair is None:
            return indexed
        added = repair.added.get(key) or {}
        for name, obj in list(added.items()):
            have = [o for o in indexed if _meta(o).get("name") == name]
            if now - repair.at > ADDED_TTL or any(supersedes(o, obj) for o in have):
                del added[name]
        if not added:
            repair.added.pop(key, None)
        shown = {name: copy.deepcopy(obj) for name, obj in added.items()}
        return repaired(indexed, repair.hidden.get(key, {}), shown)

    # -------------------------------------------------------------------------------- resync
    def resynced(self, kind: str, listed: Iterable[Mapping[str, Any]], listed_rv: int | None) -> set[Key]:
        """A fresh LIST of one kind: every object labelled ``modeldeploy.io/name`` in the watched scope,
        taken at ``listed_rv`` (the list's ``metadata.resourceVersion``; None when unknown: nothing is
        hidden). From now on (until the next call for ``kind``) :meth:`children` hides what the LIST
        proved gone and shows what it saw that the index lacks (:func:`reconcile_listing`), because kopf
        drops an index entry only on a DELETED event, which a broken watch never delivers.

        Called from any thread (the snapshot of the index is taken in the loop). Returns the owners whose
        view changed, for the caller to enqueue; nothing before :meth:`attach` or for a kind not indexed."""
        loop = self._loop
        if loop is None or kind not in self._indices:
            return set()
        listing = list(listed)

        async def snapshot() -> dict[Key, list[dict[str, Any]]]:
            return {key: [_identity(v) for v in store] for key, store in self._indices[kind].items()}

        indexed = asyncio.run_coroutine_threadsafe(snapshot(), loop).result(SNAPSHOT_TIMEOUT)
        now = self._clock()
        with self._lock:
            before = self._repairs.get(kind) or Repair()
            if now - before.at > ADDED_TTL:
                before = Repair(before.hidden, {}, before.at)
            repair, changed = reconcile_listing(indexed, listing, listed_rv, before, now)
            self._repairs[kind] = repair
        return changed

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
