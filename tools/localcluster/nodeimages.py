"""The images the real node runs: found in ``make images``' output, imported into the node's containerd.

There is no registry here: tools/build-images.sh writes OCI archives (``<cache>/<name>-<key>.tar``, cache
``${MODELDEPLOY_IMAGE_CACHE:-~/.cache/modeldeploy/images}``) and prints an env-style manifest
(``IMAGE_<NAME>_REF=docker.io/modeldeploy/...`` / ``IMAGE_<NAME>_ARCHIVE=<path>``). ``up --node containerd``
reads that manifest from ``$LOCALCLUSTER_IMAGES`` (a file holding the script's output), else from
``<cache>/manifest.env``, else takes the newest archive of each name in the cache, and imports each one
into containerd's ``k8s.io`` namespace (``ctr images import``) unless containerd already has that ref at
that digest (its root is a cache kept across clusters). With none of them, only the pause image is made
here, from the static ``pause`` binary of tools/build-binaries.sh (:func:`write_binary_image`), and ``up``
says that our images are missing.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ImageArchive:
    ref: str  # e.g. docker.io/modeldeploy/modelserver:dev
    path: Path


def image_cache() -> Path:
    if env := os.environ.get("MODELDEPLOY_IMAGE_CACHE"):
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))) / "modeldeploy" / "images"


def parse_manifest(text: str) -> list[ImageArchive]:
    """build-images.sh's output: ``IMAGE_<NAME>_REF=...`` and ``IMAGE_<NAME>_ARCHIVE=...`` lines (other
    lines ignored); an image needs both."""
    refs: dict[str, str] = {}
    paths: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if not sep or not key.startswith("IMAGE_"):
            continue
        if key.endswith("_REF"):
            refs[key[len("IMAGE_") : -len("_REF")]] = value
        elif key.endswith("_ARCHIVE"):
            paths[key[len("IMAGE_") : -len("_ARCHIVE")]] = value
    return [ImageArchive(refs[n], Path(paths[n])) for n in sorted(refs) if n in paths]


def archive_index(path: Path) -> dict[str, Any]:
    """The archive's ``index.json`` (OCI image layout)."""
    with tarfile.open(path) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ValueError(f"{path}: no index.json (not an OCI archive)")
        return dict(json.load(member))


def archive_digest(index: dict[str, Any]) -> str:
    """The digest of the archive's (first) manifest, which containerd records as the image's target."""
    return str(index["manifests"][0]["digest"])


def archive_ref(index: dict[str, Any]) -> str | None:
    """The full image name the archive carries, if any (``io.containerd.image.name``, or an
    ``org.opencontainers.image.ref.name`` that is a whole reference rather than a bare tag)."""
    ann = index["manifests"][0].get("annotations") or {}
    for key in ("io.containerd.image.name", "org.opencontainers.image.ref.name"):
        ref = ann.get(key)
        if ref and "/" in ref:
            return str(ref)
    return None


def scan_cache(cache: Path) -> list[ImageArchive]:
    """Without a manifest: the newest archive of each name in the cache, named by the ref inside it."""
    newest: dict[str, Path] = {}
    for p in sorted(cache.glob("*.tar"), key=lambda p: p.stat().st_mtime):
        newest[p.name.rsplit("-", 1)[0]] = p
    found = []
    for p in newest.values():
        try:
            ref = archive_ref(archive_index(p))
        except (OSError, ValueError, KeyError, IndexError, tarfile.TarError):
            continue
        if ref:
            found.append(ImageArchive(ref, p))
    return found


def find_archives() -> tuple[list[ImageArchive], str]:
    """The archives to import and where their list came from (for ``up``'s message)."""
    if env := os.environ.get("LOCALCLUSTER_IMAGES"):
        return parse_manifest(Path(env).read_text()), f"$LOCALCLUSTER_IMAGES ({env})"
    cache = image_cache()
    manifest = cache / "manifest.env"
    if manifest.is_file():
        return parse_manifest(manifest.read_text()), str(manifest)
    if cache.is_dir():
        return scan_cache(cache), f"the newest archives in {cache}"
    return [], f"nothing ({cache} does not exist: run `make images`)"


# ----- a one-binary image, for the pause image when `make images` was not run ---------------------------
def _blob(tar: tarfile.TarFile, data: bytes) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest.split(':')[1]}")
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return {"digest": digest, "size": len(data)}


def write_binary_image(binary: Path, ref: str, out: Path, *, entrypoint: str = "/pause") -> None:
    """An OCI archive of one static binary at ``entrypoint``, FROM scratch (what tools/pause/Containerfile
    builds), named ``ref``: the sandbox image for a node whose ``make images`` has not run yet."""
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w") as layer:
        data = binary.read_bytes()
        info = tarfile.TarInfo(entrypoint.lstrip("/"))
        info.size, info.mode = len(data), 0o755
        layer.addfile(info, io.BytesIO(data))
    raw = layer_buf.getvalue()
    gz = gzip.compress(raw, mtime=0)
    diff_id = "sha256:" + hashlib.sha256(raw).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": [entrypoint], "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    with tarfile.open(out, "w") as tar:
        layer_desc = _blob(tar, gz)
        config_desc = _blob(tar, json.dumps(config).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer_desc}],
        }
        manifest_desc = _blob(tar, json.dumps(manifest).encode())
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    **manifest_desc,
                    "annotations": {
                        "io.containerd.image.name": ref,
                        "org.opencontainers.image.ref.name": ref,
                    },
                }
            ],
        }
        for name, obj in (("oci-layout", {"imageLayoutVersion": "1.0.0"}), ("index.json", index)):
            data = json.dumps(obj).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def superseded(images: dict[str, str], current: dict[str, str]) -> list[str]:
    """The names of images that an import replaced: ``images`` is containerd's ``{name: target digest}``,
    ``current`` the refs just imported with their digests. A name of one of our repositories, or a bare
    ``sha256:`` ID (the CRI names every image by its ID too), whose digest is none of the current ones is
    an older build that nothing runs (an ID name is kept while any other name still points at its
    digest): each is a 3 GB archive's content plus its unpacked snapshot (the
    disk filled to 1 GB free after a few rebuilds of the serving image, and the kubelet evicted pods)."""
    repos = {ref.rsplit(":", 1)[0] for ref in current}
    keep = set(current.values())
    old_tags = {n for n, d in images.items() if d not in keep and n.rsplit(":", 1)[0] in repos}
    named = {d for n, d in images.items() if not n.startswith("sha256:") and n not in old_tags}
    old_ids = {n for n, d in images.items() if n.startswith("sha256:") and d not in named}
    return sorted(old_tags | old_ids)


# ----- containerd --------------------------------------------------------------------------------------
class Ctr:
    """``ctr`` against the node's containerd, in the CRI's namespace."""

    def __init__(self, ctr: Path, socket: Path, namespace: str) -> None:
        self.argv = [str(ctr), "--address", str(socket), "--namespace", namespace]

    def run(self, *args: str, check: bool = True, timeout: float = 600) -> str:
        res = subprocess.run([*self.argv, *args], capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} failed: {res.stderr.strip()}")
        return res.stdout

    def image_digests(self) -> dict[str, str]:
        """``{ref: target digest}`` of every image containerd has."""
        out: dict[str, str] = {}
        for line in self.run("images", "ls").splitlines()[1:]:
            cols = line.split()
            if len(cols) >= 3:
                out[cols[0]] = cols[2]
        return out

    def remove(self, names: list[str]) -> None:
        """Remove these image names; ``--sync`` waits for containerd's garbage collection, which frees
        the content and the unpacked snapshots nothing else names."""
        if names:
            self.run("images", "rm", "--sync", *names)

    def import_archive(self, archive: ImageArchive) -> bool:
        """Import unless containerd has the ref at the archive's digest; True when it imported."""
        index = archive_index(archive.path)
        digest = archive_digest(index)
        if self.image_digests().get(archive.ref) == digest:
            return False
        self.run("images", "import", str(archive.path))
        if archive.ref not in self.image_digests():
            raise RuntimeError(f"{archive.path} imported, but containerd has no image {archive.ref}")
        return True
