"""Pod volumes for the process node agent, provided the kubelet's way.

* :func:`field_value` resolves a downwardAPI ``fieldRef`` as the kubelet's ``fieldpath`` package does
  (``metadata.name``, ``.namespace``, ``.uid``, ``.labels``, ``.annotations`` and the subscripted
  ``metadata.labels['k']`` / ``metadata.annotations['k']``; a missing key is the empty string); whole
  maps are written by :func:`format_map`: one ``key="value"`` a line, keys sorted, values quoted as Go's
  ``%q`` (``strconv.Quote``), no trailing newline.
* :class:`AtomicWriter` writes a volume's files like the kubelet's ``AtomicWriter``
  (``pkg/volume/util/atomic_writer.go``): the files go into a fresh hidden directory
  ``..2026_01_02_15_04_05.xxxx``, the symlink ``..data`` is replaced by ``rename(2)`` to point at it, and
  each item's first path component is a symlink ``name -> ..data/name``. A reader opening ``name`` sees
  either the old or the new content, never a half-written file. ``downwardAPI``, ``configMap`` and
  ``secret`` volumes are written this way.
* :class:`PodVolumes` resolves one pod's volumes (:meth:`PodVolumes.prepare`, retried by the agent until
  every volume is there, as the kubelet's volume manager does before it starts any container):

  - ``downwardAPI`` under ``<pod dir>/volumes/<name>``, rewritten whenever the agent sees a newer pod
    object (:meth:`PodVolumes.sync`);
  - ``configMap`` / ``secret`` (``items`` or every key, ``mode`` / ``defaultMode``, ``optional``) under
    ``<pod dir>/volumes/<name>``, re-read by :meth:`PodVolumes.refresh`;
  - ``emptyDir``: the directory ``<pod dir>/volumes/<name>``, shared by the pod's containers and removed
    with the pod (``medium: Memory`` and ``sizeLimit`` are not enforced: a plain directory);
  - ``hostPath``: the host's path itself, type ``""`` (must exist), ``Directory``, ``DirectoryOrCreate``
    (``mkdir -p``, 0755), ``File``, ``FileOrCreate``, ``Socket``, ``CharDevice``, ``BlockDevice`` checked
    like the kubelet's ``hostPathTypeChecker``;
  - ``persistentVolumeClaim``: the claim must be ``Bound``; its PersistentVolume's ``hostPath`` or
    ``local`` path is mounted (``readOnly`` on the claim forces every mount read-only). Other PV types
    are refused.

  ``configMap``, ``secret`` and ``downwardAPI`` volumes are always mounted read-only, as the kubelet
  does. Other volume types (the service-account ``projected`` volume, ...) are skipped with a log line.
* :func:`container_mounts` and :func:`wrap_command` turn a container's ``volumeMounts`` (``readOnly``,
  ``subPath``) and its termination-message file into the argv that starts it in a private mount
  namespace with the volumes bind-mounted at their ``mountPath`` (:mod:`localcluster.podmount`).
  A mount that would cover a path the pod's processes need on the host (the repository, the Python
  environment, the cluster's state directory — e.g. the chart's operator pod mounts an ``emptyDir`` at
  ``/tmp``, where the tests' clusters and a CI clone live) gets those paths bound back on top of it
  (``--keep``, see :mod:`localcluster.podmount`).

``resourceFieldRef`` items and ``subPathExpr`` are refused (:class:`VolumeError`).
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import os
import shutil
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("localcluster.volumes")

DATA_DIR = "..data"
DATA_DIR_TMP = "..data_tmp"
DEFAULT_MODE = 0o644


class VolumeError(ValueError):
    """A volume or mount the agent cannot provide; the container is not started."""


# ----- the kubelet's fieldpath package -------------------------------------------------------------


def go_quote(s: str) -> str:
    """``strconv.Quote``: Go's ``%q`` of a string (valid UTF-8 in, as JSON strings are)."""
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch == " " or (ch.isprintable() and not 0xD800 <= o <= 0xDFFF):
            out.append(ch)
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\x{o:02x}")
        elif 0xD800 <= o <= 0xDFFF:  # a lone surrogate is not valid UTF-8: Go writes U+FFFD
            out.append("\ufffd")
        elif o < 0x10000:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    out.append('"')
    return "".join(out)


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def format_map(m: Mapping[str, str]) -> str:
    """``fieldpath.FormatMap``: ``key="value"`` lines, sorted by key (bytewise), no trailing newline."""
    return "\n".join(f"{k}={go_quote(m[k])}" for k in sorted(m, key=lambda k: k.encode()))


def split_subscripted(field_path: str) -> tuple[str, str, bool]:
    """``SplitMaybeSubscriptedPath``: ``"metadata.labels['k']"`` -> ``("metadata.labels", "k", True)``.

    A path without a subscript comes back as ``(field_path, "", False)``."""
    if not field_path.endswith("']"):
        return field_path, "", False
    head, sep, key = field_path.removesuffix("']").partition("['")
    if not sep or not head:
        return field_path, "", False
    return head, key, True


def field_value(pod: Mapping[str, Any], field_path: str) -> str:
    """The content of a downwardAPI volume file for a ``fieldRef.fieldPath`` (as the kubelet writes it)."""
    meta = pod.get("metadata") or {}
    path, key, subscripted = split_subscripted(field_path)
    if subscripted:
        if path in ("metadata.annotations", "metadata.labels"):
            return str((meta.get(path.split(".", 1)[1]) or {}).get(key, ""))
        raise VolumeError(f"fieldPath {field_path!r} does not support a subscript")
    if field_path in ("metadata.annotations", "metadata.labels"):
        return format_map(meta.get(field_path.split(".", 1)[1]) or {})
    if field_path in ("metadata.name", "metadata.namespace", "metadata.uid"):
        return str(meta.get(field_path.split(".", 1)[1], ""))
    raise VolumeError(f"unsupported fieldPath in a downwardAPI volume: {field_path!r}")


# ----- the kubelet's AtomicWriter ------------------------------------------------------------------


@dataclass(frozen=True)
class FileProjection:
    data: bytes
    mode: int = DEFAULT_MODE


def validate_path(p: str) -> str:
    """A payload path as the AtomicWriter accepts it: relative, no ``..`` element, not starting ``..``."""
    if not p or len(p) > 4096 or p.startswith("/") or p.startswith(".."):
        raise VolumeError(f"invalid volume file path {p!r}")
    if any(part == ".." for part in p.split("/")):
        raise VolumeError(f"invalid volume file path {p!r}: '..' element")
    norm = os.path.normpath(p)
    if norm == ".":
        raise VolumeError(f"invalid volume file path {p!r}")
    return norm


def downward_payload(pod: Mapping[str, Any], source: Mapping[str, Any]) -> dict[str, FileProjection]:
    """The files of a ``downwardAPI`` volume source for this pod object."""
    default_mode = int(source.get("defaultMode", DEFAULT_MODE))
    payload: dict[str, FileProjection] = {}
    for item in source.get("items") or []:
        path = validate_path(str(item.get("path", "")))
        mode = int(item.get("mode", default_mode))
        if "fieldRef" in item:
            value = field_value(pod, str(item["fieldRef"].get("fieldPath", "")))
        elif "resourceFieldRef" in item:
            raise VolumeError(
                f"downwardAPI item {path!r}: resourceFieldRef is not supported by the node agent"
            )
        else:
            raise VolumeError(f"downwardAPI item {path!r} has neither fieldRef nor resourceFieldRef")
        payload[path] = FileProjection(value.encode(), mode)
    return payload


def _ts_dir_prefix(now: dt.datetime | None = None) -> str:
    return (now or dt.datetime.now(dt.UTC)).strftime("..%Y_%m_%d_%H_%M_%S.")


class AtomicWriter:
    """Writes a payload into ``target`` so readers see a whole old or a whole new set of files."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def _read_dir(self, ts_dir: Path) -> dict[str, FileProjection]:
        files: dict[str, FileProjection] = {}
        for root, _dirs, names in os.walk(ts_dir):
            for name in names:
                full = Path(root) / name
                files[str(full.relative_to(ts_dir))] = FileProjection(
                    full.read_bytes(), full.stat().st_mode & 0o7777
                )
        return files

    def write(self, payload: Mapping[str, FileProjection]) -> bool:
        """Project ``payload``; False when the volume already held exactly it (nothing touched)."""
        payload = {validate_path(p): f for p, f in payload.items()}
        self.target.mkdir(parents=True, exist_ok=True)
        data_link = self.target / DATA_DIR
        old_ts = os.readlink(data_link) if data_link.is_symlink() else ""
        old = self._read_dir(self.target / old_ts) if old_ts else {}
        wanted_top = {p.split("/", 1)[0] for p in payload}
        stale_top = {p.split("/", 1)[0] for p in old} - wanted_top
        if old_ts and old == dict(payload) and not stale_top:
            self._link_visible(wanted_top)
            return False
        ts_dir = Path(tempfile.mkdtemp(prefix=_ts_dir_prefix(), dir=self.target))
        try:
            for rel, f in payload.items():
                dest = ts_dir / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(f.data)
                dest.chmod(f.mode)
            ts_dir.chmod(0o755)
            tmp_link = self.target / DATA_DIR_TMP
            tmp_link.unlink(missing_ok=True)
            os.symlink(ts_dir.name, tmp_link)
            os.rename(tmp_link, data_link)  # the atomic switch
        except BaseException:
            shutil.rmtree(ts_dir, ignore_errors=True)
            raise
        self._link_visible(wanted_top)
        for name in stale_top:
            (self.target / name).unlink(missing_ok=True)
        if old_ts and old_ts != ts_dir.name:
            shutil.rmtree(self.target / old_ts, ignore_errors=True)
        return True

    def _link_visible(self, names: set[str]) -> None:
        for name in names:
            link = self.target / name
            if not link.is_symlink():
                os.symlink(f"{DATA_DIR}/{name}", link)


# ----- configMap and secret payloads --------------------------------------------------------------


def keyed_payload(
    kind: str, name: str, obj: Mapping[str, Any] | None, source: Mapping[str, Any]
) -> dict[str, FileProjection]:
    """The files of a ``configMap`` or ``secret`` volume (``kind``) from the object (None: missing).

    As the kubelet's configmap/secret volume plugins: without ``items`` every key becomes a file named
    after it; ``items`` pick keys (a missing key is an error unless ``optional``); ``mode`` per item,
    else ``defaultMode`` (0644). A missing object is an error unless ``optional`` (then: no files)."""
    optional = bool(source.get("optional"))
    if obj is None:
        if optional:
            return {}
        raise VolumeError(f'{kind.lower()} "{name}" not found')
    data: dict[str, bytes] = {}
    if kind == "Secret":
        for k, v in (obj.get("data") or {}).items():
            data[k] = base64.b64decode(v)
        for k, v in (obj.get("stringData") or {}).items():
            data[k] = str(v).encode()
    else:
        for k, v in (obj.get("data") or {}).items():
            data[k] = str(v).encode()
        for k, v in (obj.get("binaryData") or {}).items():
            data[k] = base64.b64decode(v)
    default_mode = int(source.get("defaultMode", DEFAULT_MODE))
    payload: dict[str, FileProjection] = {}
    items = source.get("items")
    if not items:
        for k, v in data.items():
            payload[validate_path(k)] = FileProjection(v, default_mode)
        return payload
    for item in items:
        key = str(item.get("key", ""))
        if key not in data:
            if optional:
                continue
            raise VolumeError(f"{kind.lower()} references non-existent config key: {key}")
        path = validate_path(str(item.get("path", "")))
        payload[path] = FileProjection(data[key], int(item.get("mode", default_mode)))
    return payload


# ----- hostPath ------------------------------------------------------------------------------------

_HOSTPATH_CHECKS: dict[str, Callable[[int], bool]] = {
    "Directory": stat.S_ISDIR,
    "File": stat.S_ISREG,
    "Socket": stat.S_ISSOCK,
    "CharDevice": stat.S_ISCHR,
    "BlockDevice": stat.S_ISBLK,
}
_HOSTPATH_WORDS = {
    "Directory": "a directory",
    "File": "a file",
    "Socket": "a socket file",
    "CharDevice": "a character device",
    "BlockDevice": "a block device",
}


def prepare_host_path(path: str, host_type: str) -> Path:
    """Check (and for the ``...OrCreate`` types create) a hostPath like the kubelet's type checker."""
    if not path.startswith("/"):
        raise VolumeError(f"hostPath {path!r} is not absolute")
    p = Path(os.path.normpath(path))
    if host_type == "DirectoryOrCreate":
        if not p.exists():
            p.mkdir(mode=0o755, parents=True, exist_ok=True)
        host_type = "Directory"
    elif host_type == "FileOrCreate":
        if not p.exists():
            if not p.parent.is_dir():
                raise VolumeError(f"hostPath type check failed: {p.parent} is not a directory")
            p.touch(mode=0o644)
        host_type = "File"
    if host_type == "":
        if not p.exists():
            raise VolumeError(f"hostPath {p} does not exist (type is unset: the node agent creates nothing)")
        return p
    check = _HOSTPATH_CHECKS.get(host_type)
    if check is None:
        raise VolumeError(f"hostPath type {host_type!r} is not supported")
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        raise VolumeError(f"hostPath type check failed: {p} is not {_HOSTPATH_WORDS[host_type]}") from None
    if not check(mode):
        raise VolumeError(f"hostPath type check failed: {p} is not {_HOSTPATH_WORDS[host_type]}")
    return p


def persistent_volume_path(pv: Mapping[str, Any]) -> tuple[str, str]:
    """The host path of a ``hostPath`` or ``local`` PersistentVolume, and the hostPath type to check."""
    spec = pv.get("spec") or {}
    name = (pv.get("metadata") or {}).get("name", "")
    if "hostPath" in spec:
        return str(spec["hostPath"]["path"]), str(spec["hostPath"].get("type") or "")
    if "local" in spec:
        return str(spec["local"]["path"]), "Directory"
    kinds = sorted(k for k in spec if isinstance(spec[k], dict) and k not in ("claimRef", "nodeAffinity"))
    raise VolumeError(
        f"PersistentVolume {name!r} ({', '.join(kinds) or 'unknown type'}): the node agent mounts only "
        "hostPath and local volumes"
    )


# ----- one pod's volumes ---------------------------------------------------------------------------

Lookup = Callable[[str], "dict[str, Any] | None"]  # an API GET: the object, or None when it is missing

SUPPORTED = ("downwardAPI", "emptyDir", "hostPath", "persistentVolumeClaim", "configMap", "secret")
WRITTEN = ("downwardAPI", "configMap", "secret")  # written by the AtomicWriter, always read-only


@dataclass
class Volume:
    name: str
    kind: str  # one of SUPPORTED
    source: Mapping[str, Any]
    path: Path | None = None  # on the host, once prepared
    read_only: bool = False  # every mount of it is read-only
    ready: bool = False


def _no_lookup(path: str) -> dict[str, Any] | None:
    raise VolumeError(f"no API access to read {path}")


class PodVolumes:
    """One pod's volumes: the written and emptyDir ones under ``root`` (``<pod dir>/volumes``)."""

    def __init__(self, pod: Mapping[str, Any], root: Path, lookup: Lookup | None = None) -> None:
        self.root = root
        self.namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
        self.lookup = lookup or _no_lookup
        self.volumes: dict[str, Volume] = {}
        self.skipped: dict[str, str] = {}  # volume name -> its type, not provided
        self.errors: dict[str, str] = {}  # volume name -> why it cannot be provided (yet)
        for v in (pod.get("spec") or {}).get("volumes") or []:
            kind = next((k for k in SUPPORTED if k in v), None)
            if kind is None:
                self.skipped[v["name"]] = next((k for k in v if k != "name"), "unknown")
                continue
            self.volumes[v["name"]] = Volume(v["name"], kind, v[kind] or {}, read_only=kind in WRITTEN)
        self._pod = pod
        self._lock = threading.Lock()
        self._rv = -1
        self._removed = False
        self.writes = 0

    @property
    def sources(self) -> dict[str, Mapping[str, Any]]:
        return {name: v.source for name, v in self.volumes.items()}

    def dir_of(self, name: str) -> Path:
        v = self.volumes.get(name)
        if v is not None and v.path is not None:
            return v.path
        return self.root / name

    # -- resolution --------------------------------------------------------------------------------
    def prepare(self) -> dict[str, str]:
        """Provide every volume not provided yet; the errors left (empty: all ready). Retry until empty."""
        with self._lock:
            if self._removed:
                return {}
            for v in self.volumes.values():
                if v.ready:
                    continue
                try:
                    self._provide(v, self._pod)
                except (VolumeError, OSError) as exc:
                    if self.errors.get(v.name) != str(exc):
                        log.warning("volume %s of pod %s: %s", v.name, _pod_name(self._pod), exc)
                    self.errors[v.name] = str(exc)
                    continue
                v.ready = True
                self.errors.pop(v.name, None)
            return dict(self.errors)

    @property
    def ready(self) -> bool:
        return all(v.ready for v in self.volumes.values())

    def _provide(self, v: Volume, pod: Mapping[str, Any]) -> None:
        if v.kind == "downwardAPI":
            self._write(v, downward_payload(pod, v.source))
        elif v.kind in ("configMap", "secret"):
            self._write(v, self._keyed(v))
        elif v.kind == "emptyDir":
            v.path = self.root / v.name
            v.path.mkdir(parents=True, exist_ok=True)
            v.path.chmod(0o777)  # the kubelet's emptyDir mode
        elif v.kind == "hostPath":
            v.path = prepare_host_path(str(v.source.get("path", "")), str(v.source.get("type") or ""))
        elif v.kind == "persistentVolumeClaim":
            v.path, v.read_only = self._claim(v)

    def _write(self, v: Volume, payload: Mapping[str, FileProjection]) -> bool:
        v.path = self.root / v.name
        changed = AtomicWriter(v.path).write(payload)
        if changed:
            self.writes += 1
        return changed

    def _keyed(self, v: Volume) -> dict[str, FileProjection]:
        kind, key = ("Secret", "secretName") if v.kind == "secret" else ("ConfigMap", "name")
        name = str(v.source.get(key, ""))
        plural = "secrets" if kind == "Secret" else "configmaps"
        obj = self.lookup(f"/api/v1/namespaces/{self.namespace}/{plural}/{name}")
        return keyed_payload(kind, name, obj, v.source)

    def _claim(self, v: Volume) -> tuple[Path, bool]:
        claim = str(v.source.get("claimName", ""))
        pvc = self.lookup(f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims/{claim}")
        if pvc is None:
            raise VolumeError(f'persistentvolumeclaim "{claim}" not found')
        phase = (pvc.get("status") or {}).get("phase")
        pv_name = (pvc.get("spec") or {}).get("volumeName")
        if phase != "Bound" or not pv_name:
            raise VolumeError(f'persistentvolumeclaim "{claim}" is not bound (phase {phase or "unknown"})')
        pv = self.lookup(f"/api/v1/persistentvolumes/{pv_name}")
        if pv is None:
            raise VolumeError(f'persistentvolume "{pv_name}" (bound to claim "{claim}") not found')
        path, host_type = persistent_volume_path(pv)
        return prepare_host_path(path, host_type), bool(v.source.get("readOnly"))

    # -- updates -------------------------------------------------------------------------------------
    def sync(self, pod: Mapping[str, Any]) -> None:
        """Rewrite the downwardAPI volumes from ``pod`` unless a newer pod object was already written."""
        rv = int((pod.get("metadata") or {}).get("resourceVersion") or 0)
        with self._lock:
            if rv < self._rv or self._removed:
                return
            self._rv = rv
            self._pod = pod
            for v in self.volumes.values():
                if v.kind != "downwardAPI" or not v.ready:
                    continue
                try:
                    changed = self._write(v, downward_payload(pod, v.source))
                except (VolumeError, OSError) as exc:
                    if self.errors.get(v.name) != str(exc):
                        log.warning("volume %s of pod %s: %s", v.name, _pod_name(pod), exc)
                    self.errors[v.name] = str(exc)
                    continue
                self.errors.pop(v.name, None)
                if changed:
                    log.info("volume %s of pod %s written (resourceVersion %d)", v.name, _pod_name(pod), rv)

    @property
    def refreshable(self) -> bool:
        return any(v.kind in ("configMap", "secret") for v in self.volumes.values())

    def refresh(self) -> None:
        """Re-read the configMap and secret volumes' objects and rewrite what changed."""
        with self._lock:
            if self._removed:
                return
            for v in self.volumes.values():
                if v.kind not in ("configMap", "secret") or not v.ready:
                    continue
                try:
                    if self._write(v, self._keyed(v)):
                        log.info("volume %s of pod %s rewritten", v.name, _pod_name(self._pod))
                except (VolumeError, OSError) as exc:
                    log.warning("volume %s of pod %s not refreshed: %s", v.name, _pod_name(self._pod), exc)

    def remove(self) -> None:
        """Remove what the pod owns (``root``: emptyDir and written volumes); hostPath and PV data stay."""
        with self._lock:
            self._removed = True
            self._rv = sys.maxsize  # a late sync must not recreate what is removed
            shutil.rmtree(self.root, ignore_errors=True)


def _pod_name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


# ----- mounts --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mount:
    source: Path  # a directory, or a file (a subPath to a file, the termination-message file)
    path: str  # the container's mountPath
    read_only: bool


def nearest_existing(path: str, exists: Callable[[str], bool] = os.path.lexists) -> str:
    p = os.path.normpath(path)
    while not exists(p):
        p = os.path.dirname(p)
    return p


def check_mount_path(what: str, path: str, exists: Callable[[str], bool] = os.path.lexists) -> str:
    """A mountPath the agent can provide: absolute, plain, with an existing parent other than ``/``."""
    if not path.startswith("/") or any(c in path for c in ",:\n"):
        raise VolumeError(f"{what}: unsupported mountPath {path!r}")
    if nearest_existing(path, exists) == "/":
        raise VolumeError(
            f"{what} at {path}: the node agent mounts only where the path or a parent "
            "directory other than / exists (it never creates directories on the host)"
        )
    return os.path.normpath(path)


def _sub_path(volumes: PodVolumes, name: str, sub: str) -> Path:
    """The source of a ``subPath`` mount: inside the volume (symlinks resolved), created for a
    writable volume as the kubelet does."""
    rel = validate_path(sub)
    v = volumes.volumes[name]
    base = volumes.dir_of(name)
    src = base / rel
    if v.kind in WRITTEN:  # the item's current file: a snapshot, like the kubelet's subPath bind
        real = Path(os.path.realpath(src))
        if not real.is_relative_to(os.path.realpath(base)) or not real.exists():
            raise VolumeError(f"subPath {sub!r} of volume {name!r} does not exist")
        return real
    if not src.exists():
        src.mkdir(mode=0o755, parents=True, exist_ok=True)
    real = Path(os.path.realpath(src))
    if not real.is_relative_to(os.path.realpath(base)):
        raise VolumeError(f"subPath {sub!r} of volume {name!r} leaves the volume")
    return real


def container_mounts(
    container: Mapping[str, Any],
    volumes: PodVolumes,
    exists: Callable[[str], bool] = os.path.lexists,
) -> tuple[list[Mount], list[str]]:
    """The mounts of a container and notes on the ``volumeMounts`` skipped (volume types not provided).

    Call once :meth:`PodVolumes.prepare` succeeded. Raises :class:`VolumeError` for a mount that cannot
    be provided (the container must not start)."""
    mounts: list[Mount] = []
    skipped: list[str] = []
    for vm in container.get("volumeMounts") or []:
        name, path = vm["name"], str(vm["mountPath"])
        if name not in volumes.volumes:
            skipped.append(f"{name} at {path}")
            continue
        if name in volumes.errors:
            raise VolumeError(f"volume {name!r}: {volumes.errors[name]}")
        if vm.get("subPathExpr"):
            raise VolumeError(
                f"volumeMount {name!r} at {path}: subPathExpr is not supported by the node agent"
            )
        target = check_mount_path(f"volumeMount {name!r}", path, exists)
        source = _sub_path(volumes, name, str(vm["subPath"])) if vm.get("subPath") else volumes.dir_of(name)
        read_only = bool(vm.get("readOnly")) or volumes.volumes[name].read_only
        mounts.append(Mount(source, target, read_only))
    return mounts, skipped


def keep_paths(extra: Iterable[Path] = ()) -> list[str]:
    """Host paths a pod's processes need whatever a volume covers: the repository, the Python
    environment (the virtualenv and its base) and ``extra`` (the cluster's state directory)."""
    from .state import REPO_ROOT

    paths = {os.path.realpath(str(p)) for p in (REPO_ROOT, sys.prefix, sys.base_prefix, *extra)}
    return sorted(p for p in paths if p != "/")


def wrap_command(argv: list[str], mounts: list[Mount], scratch: Path, keep: Iterable[str] = ()) -> list[str]:
    """``argv`` started in a private mount namespace with ``mounts`` in place (see :mod:`.podmount`)."""
    if not mounts:
        return argv
    cmd = ["unshare", "--mount", "--propagation", "private", sys.executable, "-m", "localcluster.podmount"]
    cmd += ["--scratch", str(scratch)]
    for k in keep:
        cmd += ["--keep", k]
    for m in mounts:
        cmd += ["--bind", str(m.source), m.path, "ro" if m.read_only else "rw"]
    return [*cmd, "--", *argv]
