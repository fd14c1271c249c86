"""What the fetch unit tests share (test_fetch.py, test_fetch_cache.py): the credentials the in-process S3
server is given, a small model tree, and helpers to put, write and read trees and to run the CLI. The S3
fixtures (``s3_endpoint``, ``s3_env``, ``s3``, ``bucket``) are in conftest.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from modelserver.fetch import FetchOptions
from modelserver.storage_s3 import ClientOptions

ACCESS_KEY = "AKIAFETCHTESTKEY0001"
SECRET_KEY = "fetch-test-secret/Zx81+never-in-output"
REPO = Path(__file__).resolve().parents[3]
MiB = 1 << 20


def put_tree(s3: Any, bucket: str, prefix: str, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        s3.put_object(Bucket=bucket, Key=f"{prefix}/{rel}", Body=data)


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


MODEL = {
    "config.json": b'{"architectures": ["BertModel"]}',
    "tokenizer.json": b"{}" * 100,
    "1_Pooling/config.json": b'{"pooling_mode_mean_tokens": true}',
    "model.safetensors": os.urandom(3 * MiB + 17),
}


def opts(**kw: Any) -> FetchOptions:
    base: dict[str, Any] = {
        "timeout": 60.0,
        "progress_interval": 0.2,
        "client": ClientOptions(connect_timeout=2, read_timeout=5, max_attempts=2),
    }
    base.update(kw)
    return FetchOptions(**base)


def run_cli(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and not k.startswith("S3_")}
    full.update(env)
    full["PYTHONPATH"] = os.pathsep.join([str(REPO / "serving_image"), full.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "modelserver.fetch", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def json_lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def no_staging_left(dest: Path) -> None:
    leftovers = list(dest.parent.glob(f".{dest.name}.fetch-*"))
    if dest.is_dir():
        leftovers += list(dest.glob(".fetch-*"))
    assert leftovers == []
