"""Settings precedence, checksums, URI handling and format detection (no torch)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from modelserver.config import ConfigError, load_settings, settings_table
from modelserver.errors import ModelLoadError
from modelserver.loader import _safe_extract, detect_format, dir_digest, fetch, file_sha256, verify


def test_precedence_flag_env_file_default(tmp_path: Path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model_name: from-file\nmax-batch-size: 7\nport: 9000\nbuckets: [32, 8]\n")
    env = {"MODELSERVER_CONFIG": str(cfg), "MODELSERVER_PORT": "9100", "MODELSERVER_MODEL_URI": "noop://"}
    s = load_settings(["--port", "9200"], environ=env)
    assert s.port == 9200  # flag beats env
    s = load_settings([], environ=env)
    assert s.port == 9100  # env beats file
    assert s.model_name == "from-file" and s.max_batch_size == 7  # file beats default
    assert s.buckets == [8, 32]
    assert s.max_queue_delay_ms == 5.0  # default


def test_json_config_and_bucket_strings(tmp_path: Path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"model_uri": "noop://", "model_name": "m", "buckets": "auto"}))
    s = load_settings(["--config", str(cfg), "--truncate", "yes"], environ={})
    assert s.buckets is None and s.truncate is True
    s = load_settings(["--config", str(cfg)], environ={"MODELSERVER_BUCKETS": "64, 16,256"})
    assert s.buckets == [16, 64, 256]


@pytest.mark.parametrize(
    "argv",
    [
        ["--model-uri", "x"],  # no name
        ["--model-name", "m"],  # no uri
        ["--model-name", "m", "--model-uri", "x", "--device", "tpu"],
        ["--model-name", "m", "--model-uri", "x", "--max-batch-size", "0"],
        ["--model-name", "m", "--model-uri", "x", "--port", "abc"],
        ["--model-name", "m", "--model-uri", "x", "--default-timeout-ms", "10", "--max-timeout-ms", "5"],
        ["--model-name", "m", "--model-uri", "x", "--model-sha256", "xyz"],
        ["--model-name", "m", "--model-uri", "x", "--buckets", "1,a"],
        ["--model-name", "m", "--model-uri", "x", "--shadow-service", "md-{revision}.ns.svc:8080"],
    ],
)
def test_invalid_settings(argv):
    with pytest.raises(ConfigError):
        load_settings(argv, environ={})


def test_unknown_file_key_is_an_error(tmp_path: Path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model_name: m\nmodel_uri: noop://\nmax_batchsize: 3\n")
    with pytest.raises(ConfigError, match="max_batchsize"):
        load_settings(["--config", str(cfg)], environ={})


def test_other_environment_variables_are_ignored_and_booleans_read_as_words():
    env = {"MODELSERVER_MODEL_URI": "noop://", "MODELSERVER_NOT_A_SETTING": "x", "MODELSERVER_WARMUP": "off"}
    s = load_settings(["--model-name", "m"], environ=env)
    assert s.warmup is False and s.model_uri == "noop://"


def test_every_setting_has_an_env_var():
    rows = settings_table()
    assert ("--model-uri", "MODELSERVER_MODEL_URI") in [(r[0], r[1]) for r in rows]
    assert all(r[1] == "MODELSERVER_" + r[0][2:].replace("-", "_").upper() for r in rows)


def test_dir_digest_is_deterministic_and_content_sensitive(tmp_path: Path):
    d = tmp_path / "m"
    (d / "sub").mkdir(parents=True)
    (d / "a.json").write_text("{}")
    (d / "sub" / "b.bin").write_bytes(b"\x00\x01")
    expected = hashlib.sha256(
        b"a.json\0" + hashlib.sha256(b"{}").hexdigest().encode() + b"\n"
        b"sub/b.bin\0" + hashlib.sha256(b"\x00\x01").hexdigest().encode() + b"\n"
    ).hexdigest()
    assert dir_digest(d) == expected
    verify(d, expected)
    (d / "sub" / "b.bin").write_bytes(b"\x00\x02")
    with pytest.raises(ModelLoadError, match="sha256 mismatch"):
        verify(d, expected)
    f = d / "a.json"
    assert file_sha256(f) == hashlib.sha256(b"{}").hexdigest()


def test_fetch_file_uri_and_missing(tmp_path: Path):
    from modelserver.config import Settings

    f = tmp_path / "model.pt2"
    f.write_bytes(b"x")
    s = Settings(model_uri=f"file://{f}", model_name="m", model_sha256=hashlib.sha256(b"x").hexdigest())
    assert fetch(s) == f
    with pytest.raises(ModelLoadError, match="does not exist"):
        fetch(Settings(model_uri=str(tmp_path / "nope"), model_name="m"))
    with pytest.raises(ModelLoadError, match="scheme"):
        fetch(Settings(model_uri="gs://bucket/x", model_name="m"))  # s3:// is fetched (test_loader_fetch)


def test_detect_format(tmp_path: Path):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"")
    assert detect_format(hf) == "hf"
    h = tmp_path / "h"
    h.mkdir()
    (h / "handler.py").write_text("")
    assert detect_format(h) == "custom"
    assert detect_format(tmp_path / "x.pt2") == "export"
    assert detect_format(tmp_path / "x.pt") == "torchscript"
    bin_only = tmp_path / "bin"
    bin_only.mkdir()
    (bin_only / "config.json").write_text("{}")
    (bin_only / "pytorch_model.bin").write_bytes(b"")  # pickled weights are never loaded
    with pytest.raises(ModelLoadError):
        detect_format(bin_only)


def test_archive_entries_may_not_escape(tmp_path: Path):
    arc = tmp_path / "evil.tar.gz"
    with tarfile.open(arc, "w:gz") as t:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 1
        t.addfile(info, io.BytesIO(b"x"))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ModelLoadError, match="escapes"):
        _safe_extract(arc, out)
    assert not (tmp_path / "escape.txt").exists()


@pytest.mark.parametrize(
    ("argv", "env"),
    [(["--scheduler", "adaptive-v1"], {}), ([], {"MODELSERVER_SCHEDULER": "adaptive-v1"})],
)
def test_the_benchmarks_scheduler_adaptive_v1_is_no_server_setting(argv, env):
    """adaptive-v1 lives in bench/batching_v1.py (docs/upgrade.md): the server refuses it, naming the
    setting and what it accepts."""
    with pytest.raises(ConfigError, match=r"scheduler: Input should be 'adaptive' or 'fifo'"):
        load_settings(["--model-name", "m", "--model-uri", "noop://", *argv], environ=env)
    assert load_settings(["--model-name", "m", "--model-uri", "noop://"], environ={}).scheduler == "adaptive"
