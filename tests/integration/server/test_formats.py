"""Model formats end to end in-process (real torch/transformers, ASGI client): TorchScript, torch.export,
custom handler, Hugging Face classification, and an http:// model with a checksum."""

from __future__ import annotations

import hashlib
import http.server
import shutil
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from conftest import minilm_dir
from modelserver.app import ModelServerApp
from modelserver.config import load_settings
from modelserver.errors import ModelLoadError
from modelserver.loader import create_model, dir_digest
from modelserver.service import ModelService


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))


async def serve(*args: str) -> tuple[httpx.AsyncClient, ModelService]:
    settings = load_settings(["--model-name", "m", "--num-threads", "1", *args], environ={})
    service = ModelService(settings, create_model(settings))
    await service.start()
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=ModelServerApp(service)), base_url="http://t"
    )
    return client, service


def tensor_body(name: str, arr: np.ndarray, datatype: str = "FP32") -> dict:
    return {
        "inputs": [
            {"name": name, "shape": list(arr.shape), "datatype": datatype, "data": arr.ravel().tolist()}
        ]
    }


async def _check_tiny(client: httpx.AsyncClient, input_name: str, output_name: str) -> None:
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    r = await client.post("/v2/models/m/infer", json=tensor_body(input_name, x))
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    assert out["name"] == output_name and out["shape"] == [5, 2]
    want = Tiny()(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(np.array(out["data"], dtype=np.float32).reshape(5, 2), want, atol=1e-6)
    bad = await client.post("/v2/models/m/infer", json=tensor_body(input_name, x[:, :3]))
    assert bad.status_code == 400 and "shape" in bad.json()["error"]
    wrong_type = await client.post(
        "/v2/models/m/infer", json=tensor_body(input_name, x.astype(np.int64), "INT64")
    )
    assert wrong_type.status_code == 400


async def test_torchscript_with_signature(tmp_path: Path):
    torch.jit.script(Tiny()).save(str(tmp_path / "model.pt"))
    (tmp_path / "signature.json").write_text(
        '{"inputs":[{"name":"x","datatype":"FP32","shape":[-1,4]}],'
        '"outputs":[{"name":"y","datatype":"FP32","shape":[-1,2]}]}'
    )
    client, svc = await serve("--model-uri", str(tmp_path))
    try:
        meta = (await client.get("/v2/models/m")).json()
        assert meta["platform"] == "pytorch_torchscript" and meta["inputs"][0]["shape"] == [-1, 4]
        await _check_tiny(client, "x", "y")
    finally:
        await client.aclose()
        await svc.drain()


async def test_torch_export_program(tmp_path: Path):
    batch = torch.export.Dim("batch", min=1, max=1024)
    ep = torch.export.export(Tiny(), (torch.zeros(2, 4),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(ep, str(tmp_path / "tiny.pt2"))
    client, svc = await serve("--model-uri", f"file://{tmp_path / 'tiny.pt2'}")
    try:
        meta = (await client.get("/v2/models/m")).json()
        assert meta["inputs"] == [{"name": "input__0", "datatype": "FP32", "shape": [-1, 4]}]
        assert meta["outputs"] == [{"name": "output__0", "datatype": "FP32", "shape": [-1, 2]}]
        await _check_tiny(client, "input__0", "output__0")
    finally:
        await client.aclose()
        await svc.drain()


HANDLER = """
import numpy as np

class Handler:
    inputs = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    outputs = [{"name": "chars", "datatype": "INT64", "shape": [-1]}]
    max_length = 64

    def load(self, model_dir, device):
        self.offset = int(open(model_dir + "/offset.txt").read())

    def preprocess(self, inputs):
        texts = [t if isinstance(t, str) else t.decode() for t in inputs["text"].tolist()]
        if any(t == "reject" for t in texts):
            raise ValueError("'reject' is not accepted")
        return [(t, len(t.split())) for t in texts]

    def predict(self, payloads):
        return [len(p) + self.offset for p in payloads]

    def postprocess(self, rows):
        return {"chars": np.array(rows, dtype=np.int64)}
"""


def make_handler_dir(root: Path) -> Path:
    d = root / "handler_model"
    d.mkdir()
    (d / "handler.py").write_text(HANDLER)
    (d / "offset.txt").write_text("100")
    return d


async def test_custom_handler_detected_and_checksummed(tmp_path: Path):
    d = make_handler_dir(tmp_path)
    client, svc = await serve("--model-uri", str(d), "--model-sha256", dir_digest(d))
    try:
        body = {
            "inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["abc", "hello world"]}]
        }
        r = await client.post("/v2/models/m/infer", json=body)
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [103, 111]
        body["inputs"][0]["data"] = ["reject", "x"]
        r = await client.post("/v2/models/m/infer", json=body)
        assert r.status_code == 400 and "reject" in r.json()["error"]
    finally:
        await client.aclose()
        await svc.drain()
    with pytest.raises(ModelLoadError, match="sha256 mismatch"):
        create_model(
            load_settings(["--model-name", "m", "--model-uri", str(d), "--model-sha256", "0" * 64], {})
        )


async def test_hf_classification(tmp_path: Path):
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=3,
        id2label={0: "neg", 1: "neu", 2: "pos"},
        label2id={"neg": 0, "neu": 1, "pos": 2},
    )
    torch.manual_seed(0)
    model = BertForSequenceClassification(cfg).eval()
    model.save_pretrained(str(tmp_path), safe_serialization=True)
    shutil.copy(minilm_dir() / "tokenizer.json", tmp_path / "tokenizer.json")
    client, svc = await serve("--model-uri", str(tmp_path), "--max-sequence-length", "64")
    try:
        meta = (await client.get("/v2/models/m")).json()
        assert meta["platform"] == "pytorch_hf_classification"
        texts = ["great service", "a somewhat longer sentence about nothing in particular"]
        body = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": texts}]}
        r = await client.post("/v2/models/m/infer", json=body)
        assert r.status_code == 200, r.text
        outs = {o["name"]: o for o in r.json()["outputs"]}
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
        tok.no_padding()
        tok.no_truncation()
        for i, t in enumerate(texts):
            ids = torch.tensor([tok.encode(t).ids])
            with torch.inference_mode():
                want = model(input_ids=ids).logits[0].numpy()
            got = np.array(outs["logits"]["data"], dtype=np.float32).reshape(2, 3)[i]
            np.testing.assert_allclose(got, want, atol=1e-5)
            assert outs["label"]["data"][i] == ["neg", "neu", "pos"][int(want.argmax())]
        long = await client.post(
            "/v2/models/m/infer",
            json={"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x " * 100]}]},
        )
        assert long.status_code == 413 and "64" in long.json()["error"]
    finally:
        await client.aclose()
        await svc.drain()


@pytest.fixture
def http_root(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    root = tmp_path / "www"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **k):
            super().__init__(*a, directory=str(root), **k)

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", root
    finally:
        httpd.shutdown()


async def test_http_archive_download_verified_then_loaded(tmp_path: Path, http_root):
    base, root = http_root
    d = make_handler_dir(tmp_path)
    archive = root / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as t:
        t.add(d, arcname="handler_model")
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    dl = tmp_path / "dl"
    client, svc = await serve(
        "--model-uri", f"{base}/model.tar.gz", "--model-sha256", sha, "--download-dir", str(dl)
    )
    try:
        body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["four"]}]}
        r = await client.post("/v2/models/m/infer", json=body)
        assert r.json()["outputs"][0]["data"] == [104]
    finally:
        await client.aclose()
        await svc.drain()
    bad = load_settings(
        [
            "--model-name",
            "m",
            "--model-uri",
            f"{base}/model.tar.gz",
            "--model-sha256",
            "1" * 64,
            "--download-dir",
            str(tmp_path / "dl2"),
        ],
        {},
    )
    with pytest.raises(ModelLoadError, match="sha256 mismatch"):
        create_model(bad)
    assert not list((tmp_path / "dl2").glob("*/unpacked")), "a bad archive must not be unpacked"
    with pytest.raises(ModelLoadError, match="cannot download"):
        create_model(load_settings(["--model-name", "m", "--model-uri", f"{base}/missing.pt"], {}))
