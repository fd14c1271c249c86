"""Fetching, verifying and recognising models.

URIs: a plain path, ``file:///abs/path``, ``http(s)://host/file`` (downloaded into a local directory first;
archives ``.tar``, ``.tar.gz``, ``.tgz``, ``.zip`` are unpacked after the checksum is verified, refusing
entries that escape the target), ``s3://bucket/prefix`` (fetched by :mod:`modelserver.fetch` into the
download directory) and ``noop://...`` (the built-in model).

A directory that holds exactly one file (hidden entries aside), as ``python -m modelserver.fetch`` leaves
for a single object (``/mnt/models/model.pt``), stands for that file: its format is the file's, an archive
is unpacked, and ``--model-sha256`` may be the file's sha256 (or the directory digest, as before).

Checksums (``--model-sha256``):

* a file (or a downloaded archive): the SHA-256 of its bytes;
* a directory: :func:`dir_digest`: SHA-256 over one line per regular file, in sorted order of the
  relative POSIX path: ``<relative path> NUL <hex sha256 of the content> LF``. ``python -m modelserver
  digest PATH`` prints it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tarfile
import tempfile
import urllib.request
import zipfile
from pathlib import Path
from urllib.parse import unquote, urlsplit

from .config import Settings
from .dir_digest import dir_digest_of
from .errors import ModelLoadError
from .models.base import ServedModel

log = logging.getLogger("modelserver.loader")

ARCHIVES = (".tar.gz", ".tgz", ".tar", ".zip")
TORCHSCRIPT_EXT = (".pt", ".pth", ".ts", ".torchscript", ".jit")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def dir_digest(path: Path) -> str:
    """The directory digest of the files below ``path`` (:mod:`.dir_digest`)."""
    return dir_digest_of(
        {p.relative_to(path).as_posix(): file_sha256(p) for p in path.rglob("*") if p.is_file()}
    )


def digest(path: Path) -> str:
    return dir_digest(path) if path.is_dir() else file_sha256(path)


def verify(path: Path, expected: str) -> None:
    if not expected:
        return
    got = digest(path)
    if got != expected.lower():
        raise ModelLoadError(f"sha256 mismatch for {path}: expected {expected.lower()}, got {got}")
    log.info("sha256 verified", extra={"path": str(path), "sha256": got})


def _safe_extract(archive: Path, dest: Path) -> None:
    dest_res = dest.resolve()

    def check(name: str) -> None:
        target = (dest / name).resolve()
        if target != dest_res and dest_res not in target.parents:
            raise ModelLoadError(f"archive entry {name!r} escapes the target directory")

    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            for n in z.namelist():
                check(n)
            z.extractall(dest)
    else:
        with tarfile.open(archive) as t:
            for m in t.getmembers():
                check(m.name)
                if not (m.isfile() or m.isdir()):
                    raise ModelLoadError(f"archive entry {m.name!r} is not a regular file or directory")
            t.extractall(dest, filter="data")


def _work_dir(download_dir: str, name: str) -> Path:
    base = Path(download_dir) if download_dir else Path(tempfile.mkdtemp(prefix="modelserver-"))
    return base / hashlib.sha256(name.encode()).hexdigest()[:16]


def download(url: str, download_dir: str, timeout: float = 300.0) -> Path:
    name = Path(unquote(urlsplit(url).path)).name or "model"
    target_dir = _work_dir(download_dir, url)
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / name
    tmp = target.with_name(target.name + ".part")
    log.info("downloading model", extra={"url": url, "to": str(target)})
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, tmp.open("wb") as f:
            shutil.copyfileobj(resp, f, 1 << 20)
    except Exception as e:
        raise ModelLoadError(f"cannot download {url}: {e}") from e
    os.replace(tmp, target)
    return target


def _unpack(archive: Path, out: Path) -> Path:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    _safe_extract(archive, out)
    entries = list(out.iterdir())
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else out


def single_file(path: Path) -> Path | None:
    """The one regular file of a directory that holds nothing else (hidden entries aside), else None."""
    if not path.is_dir():
        return None
    entries = [p for p in path.iterdir() if not p.name.startswith(".")]
    if len(entries) == 1 and entries[0].is_file():
        return entries[0]
    return None


def _verify_single(directory: Path, file: Path, expected: str) -> None:
    """A one-file directory matches either the file's sha256 or the directory digest."""
    if expected and file_sha256(file) == expected.lower():
        log.info("sha256 verified", extra={"path": str(file), "sha256": expected.lower()})
        return
    verify(directory, expected)


def _fetch_s3(settings: Settings) -> Path:
    from .fetch import FetchOptions, fetch_model
    from .fetch_errors import FetchError

    dest = _work_dir(settings.download_dir, settings.model_uri) / "model"
    try:
        fetch_model(settings.model_uri, dest, FetchOptions(sha256=settings.model_sha256))
    except FetchError as e:
        raise ModelLoadError(f"cannot fetch {settings.model_uri}: {e.line()}") from e
    return dest


def fetch(settings: Settings) -> Path:
    """Resolve the URI to a local path, verifying the checksum (before unpacking archives)."""
    uri = settings.model_uri
    parts = urlsplit(uri)
    if parts.scheme in ("http", "https"):
        local = download(uri, settings.download_dir)
        verify(local, settings.model_sha256)
        if local.name.endswith(ARCHIVES):
            return _unpack(local, local.parent / "unpacked")
        return local
    checked = False
    if parts.scheme == "s3":
        path = _fetch_s3(settings)  # verified by the fetch (the object's sha256 or the directory digest)
        checked = True
    elif parts.scheme == "file":
        path = Path(unquote(parts.path))
    elif parts.scheme == "":
        path = Path(uri)
    else:
        raise ModelLoadError(
            f"unsupported model URI scheme {parts.scheme!r} (use file://, http(s)://, s3:// or noop://)"
        )
    if not path.exists():
        raise ModelLoadError(f"model path {path} does not exist")
    only = single_file(path)
    if only is not None:
        # a fetched single object (/mnt/models/<basename>): the model is that file
        if not checked:
            _verify_single(path, only, settings.model_sha256)
        log.info("the model directory holds one file", extra={"path": str(only)})
        if only.name.endswith(ARCHIVES):
            return _unpack(only, _work_dir(settings.download_dir, str(only)) / "unpacked")
        return only
    if not checked:
        verify(path, settings.model_sha256)
    return path


def detect_format(path: Path) -> str:
    from .models.hf import is_hf_dir

    if path.is_dir():
        if is_hf_dir(path):
            return "hf"
        if (path / "handler.py").is_file():
            return "custom"
        if list(path.glob("*.pt2")):
            return "export"
        if any(list(path.glob("*" + ext)) for ext in TORCHSCRIPT_EXT):
            return "torchscript"
        raise ModelLoadError(
            f"cannot tell the model format of directory {path}: expected config.json + model.safetensors, "
            "handler.py, *.pt2 or a TorchScript file"
        )
    if path.suffix == ".pt2":
        return "export"
    if path.suffix in TORCHSCRIPT_EXT:
        return "torchscript"
    if path.suffix == ".py":
        return "custom"
    raise ModelLoadError(f"cannot tell the model format of {path}; set --model-format")


def _model_file(path: Path, exts: tuple[str, ...]) -> Path:
    if path.is_file():
        return path
    found = sorted(p for ext in exts for p in path.glob("*" + ext))
    if len(found) != 1:
        raise ModelLoadError(f"expected exactly one {'/'.join(exts)} file in {path}, found {len(found)}")
    return found[0]


def resolve_device(device: str) -> str:
    if device == "cpu":
        return "cpu"
    try:
        import torch
    except ImportError:
        if device == "cuda":
            raise ModelLoadError("device cuda requested but torch is not installed") from None
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    if device == "cuda":
        raise ModelLoadError("device cuda requested but CUDA is not available")
    return "cpu"


def create_model(settings: Settings) -> ServedModel:
    """Fetch, verify and construct (not yet load) the model the settings describe."""
    fmt: str = settings.model_format
    if fmt == "noop" or settings.model_uri.startswith("noop:"):
        from .models.noop import NoopModel

        return NoopModel(settings.model_uri or "noop://", settings.max_sequence_length)
    path = fetch(settings)
    if settings.handler:
        fmt = "custom"
    elif fmt == "auto":
        fmt = detect_format(path)
    needs_torch = fmt in ("hf", "torchscript", "export")
    device = resolve_device(settings.device) if needs_torch else "cpu"
    if device == "cpu" and settings.dtype != "fp32":
        log.warning("dtype %s is only used on CUDA; running fp32 on CPU", settings.dtype)
    dtype = settings.dtype if device == "cuda" else "fp32"
    if needs_torch and settings.num_threads:
        import torch

        torch.set_num_threads(settings.num_threads)
    if fmt == "hf":
        from .models.hf import HFModel

        return HFModel(
            path,
            settings.task,
            device,
            dtype,
            settings.max_sequence_length,
            settings.truncate,
            settings.packing,
        )
    if fmt in ("torchscript", "export"):
        from .models.tensor import TensorModel

        exts = (".pt2",) if fmt == "export" else TORCHSCRIPT_EXT
        return TensorModel(_model_file(path, exts), fmt, device, dtype)
    if fmt == "custom":
        from .models.custom import CustomModel

        spec = settings.handler or (f"{path}:Handler" if path.suffix == ".py" else "handler.py:Handler")
        return CustomModel(spec, path if path.is_dir() else path.parent, device)
    raise ModelLoadError(f"unknown model format {fmt!r}")
