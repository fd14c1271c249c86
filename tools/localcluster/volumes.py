"""Pod volumes for the process node agent: ``downwardAPI`` volumes written and kept current the kubelet way.

* :func:`field_value` resolves a downwardAPI ``fieldRef`` as the kubelet's ``fieldpath`` package does
  (``metadata.name``, ``.namespace``, ``.uid``, ``.labels``, ``.annotations`` and the subscripted
  ``metadata.labels['k']`` / ``metadata.annotations['k']``; a missing key is the empty string); whole
  maps are written by :func:`format_map`: one ``key="value"`` a line, keys sorted, values quoted as Go's
  ``%q`` (``strconv.Quote``), no trailing newline.
* :class:`AtomicWriter` writes a volume's files like the kubelet's ``AtomicWriter``
  (``pkg/volume/util/atomic_writer.go``): the files go into a fresh hidden directory
  ``..2026_01_02_15_04_05.xxxx``, the symlink ``..data`` is replaced by ``rename(2)`` to point at it, and
  each item's first path component is a symlink ``name -> ..data/name``. A reader opening ``name`` sees
  either the old or the new content, never a half-written file.
* :class:`PodVolumes` holds one pod's volumes under ``<pod dir>/volumes/<name>`` and rewrites them whenever
  the agent sees a newer pod object (a watch event or the answer to its own status patch), so a change
  of labels or annotations reaches the files within the watch latency.
* :func:`container_mounts` and :func:`wrap_command` turn a container's ``volumeMounts`` into the argv that
  starts it in a private mount namespace with the volumes bind-mounted at their ``mountPath``
  (:mod:`localcluster.podmount` does the mounting).

Only ``downwardAPI`` volumes are mounted. ``resourceFieldRef`` items and ``subPath`` mounts are refused
(:class:`VolumeError`: the agent reports a ``FailedMount`` event and does not start the container). Other
volume types (``emptyDir``, ``configMap``, the service-account ``projected`` volume, ...) are skipped as
before, with a log line: a process-run pod shares the host filesystem, and e.g. the operator's pods mount
an ``emptyDir`` at ``/tmp``, where the agent's own state (the pod's service-account kubeconfig) and the
tests' files live.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
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


# ----- one pod's volumes ---------------------------------------------------------------------------


class PodVolumes:
    """The downwardAPI volumes of one pod under ``root`` (``<pod dir>/volumes``), kept current."""

    def __init__(self, pod: Mapping[str, Any], root: Path) -> None:
        self.root = root
        self.sources: dict[str, Mapping[str, Any]] = {}
        self.errors: dict[str, str] = {}  # volume name -> why it cannot be provided
        for v in (pod.get("spec") or {}).get("volumes") or []:
            if "downwardAPI" in v:
                self.sources[v["name"]] = v["downwardAPI"] or {}
        self._lock = threading.Lock()
        self._rv = -1
        self.writes = 0
        self.sync(pod)

    def dir_of(self, name: str) -> Path:
        return self.root / name

    def sync(self, pod: Mapping[str, Any]) -> None:
        """Rewrite every volume from ``pod`` unless a newer pod object was already written."""
        rv = int((pod.get("metadata") or {}).get("resourceVersion") or 0)
        with self._lock:
            if rv < self._rv:
                return
            self._rv = rv
            for name, source in self.sources.items():
                try:
                    changed = AtomicWriter(self.dir_of(name)).write(downward_payload(pod, source))
                except (VolumeError, OSError) as exc:
                    if self.errors.get(name) != str(exc):
                        log.warning("volume %s of pod %s: %s", name, _pod_name(pod), exc)
                    self.errors[name] = str(exc)
                    continue
                self.errors.pop(name, None)
                if changed:
                    self.writes += 1
                    log.info("volume %s of pod %s written (resourceVersion %d)", name, _pod_name(pod), rv)

    def remove(self) -> None:
        with self._lock:
            self._rv = sys.maxsize  # a late sync must not recreate what is removed
            shutil.rmtree(self.root, ignore_errors=True)


def _pod_name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


# ----- mounts --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mount:
    source: Path
    path: str  # the container's mountPath
    read_only: bool


def nearest_existing(path: str, exists: Callable[[str], bool] = os.path.lexists) -> str:
    p = os.path.normpath(path)
    while not exists(p):
        p = os.path.dirname(p)
    return p


def container_mounts(
    container: Mapping[str, Any],
    volumes: PodVolumes,
    exists: Callable[[str], bool] = os.path.lexists,
) -> tuple[list[Mount], list[str]]:
    """The mounts of a container and notes on the ``volumeMounts`` skipped (volume types not provided).

    Raises :class:`VolumeError` for a mount that cannot be provided (the container must not start)."""
    mounts: list[Mount] = []
    skipped: list[str] = []
    for vm in container.get("volumeMounts") or []:
        name, path = vm["name"], str(vm["mountPath"])
        if name not in volumes.sources:
            skipped.append(f"{name} at {path}")
            continue
        if name in volumes.errors:
            raise VolumeError(f"volume {name!r}: {volumes.errors[name]}")
        if vm.get("subPath") or vm.get("subPathExpr"):
            raise VolumeError(f"volumeMount {name!r} at {path}: subPath is not supported by the node agent")
        if not path.startswith("/") or any(c in path for c in ",:\n"):
            raise VolumeError(f"volumeMount {name!r}: unsupported mountPath {path!r}")
        if nearest_existing(path, exists) == "/":
            raise VolumeError(
                f"volumeMount {name!r} at {path}: the node agent mounts only where the path or a parent "
                "directory other than / exists (it never creates directories on the host)"
            )
        mounts.append(Mount(volumes.dir_of(name), os.path.normpath(path), bool(vm.get("readOnly"))))
    return mounts, skipped


def wrap_command(argv: list[str], mounts: list[Mount], scratch: Path) -> list[str]:
    """``argv`` started in a private mount namespace with ``mounts`` in place (see :mod:`.podmount`)."""
    if not mounts:
        return argv
    cmd = ["unshare", "--mount", "--propagation", "private", sys.executable, "-m", "localcluster.podmount"]
    cmd += ["--scratch", str(scratch)]
    for m in mounts:
        cmd += ["--bind", str(m.source), m.path, "ro" if m.read_only else "rw"]
    return [*cmd, "--", *argv]
