"""The server as a process without torch: settings from the environment, startup failures, exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
from conftest import ServerProcess, free_port


def run_server(
    args: list[str], env_extra: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELSERVER_")}
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "modelserver", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def test_settings_from_environment_and_clean_exit(tmp_path: Path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELSERVER_")}
    env |= {
        "MODELSERVER_MODEL_URI": "noop://",
        "MODELSERVER_MODEL_NAME": "envmodel",
        "MODELSERVER_MODEL_VERSION": "7",
        "MODELSERVER_HOST": "127.0.0.1",
        "MODELSERVER_PORT": str(port),
        "MODELSERVER_MAX_BATCH_SIZE": "4",
    }
    log = (tmp_path / "log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "modelserver"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        srv = ServerProcess.__new__(ServerProcess)  # reuse the readiness wait only
        srv.proc, srv.url, srv.log_path, srv._log = proc, f"http://127.0.0.1:{port}", tmp_path / "log", log
        srv.wait_ready(60)
        meta = httpx.get(f"{srv.url}/v2/models/envmodel/versions/7").json()
        assert meta["versions"] == ["7"]
        assert httpx.get(f"{srv.url}/v2/models/envmodel/config").json()["max_batch_size"] == 4
    finally:
        proc.terminate()
        rc = proc.wait(60)
        log.close()
    assert rc == 0
    lines = (tmp_path / "log").read_text().splitlines()
    assert lines and all(line.startswith("{") for line in lines), "every log line is JSON"


def test_configuration_error_exits_2():
    r = run_server(["--model-uri", "noop://"])
    assert r.returncode == 2 and "model_name is required" in r.stderr


def test_checksum_mismatch_exits_2_before_loading(tmp_path: Path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "handler.py").write_text("raise SystemExit('the handler must not even be imported')\n")
    r = run_server(["--model-uri", str(d), "--model-name", "m", "--model-sha256", "0" * 64, "--port", "0"])
    assert r.returncode == 2
    assert "sha256 mismatch" in r.stderr


def test_model_load_failure_exits_2(tmp_path: Path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "handler.py").write_text(
        "class Handler:\n"
        "    inputs = outputs = []\n"
        "    def load(self, model_dir, device):\n"
        "        raise RuntimeError('weights are corrupt')\n"
        "    def preprocess(self, inputs): return []\n"
        "    def predict(self, payloads): return []\n"
    )
    r = run_server(
        ["--model-uri", str(d), "--model-name", "m", "--host", "127.0.0.1", "--port", str(free_port())]
    )
    assert r.returncode == 2
    assert "weights are corrupt" in r.stderr
