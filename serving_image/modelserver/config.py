"""Server settings: command-line flags, environment variables and one config file.

Precedence, highest first: command-line flag > environment variable > config file > default.

Every setting ``foo_bar`` is
  * the flag ``--foo-bar``,
  * the environment variable ``MODELSERVER_FOO_BAR``,
  * the key ``foo_bar`` (or ``foo-bar``) in the YAML/JSON file given by ``--config`` /
    ``MODELSERVER_CONFIG``.

This module imports nothing heavy (no torch), so ``--help`` and config errors are instant.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_PREFIX = "MODELSERVER_"


class ConfigError(ValueError):
    """A setting is missing or invalid."""


def _parse_bool(value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    v = str(value).strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"not a boolean: {value!r}")


def _parse_buckets(value: Any) -> list[int] | None:
    """``"auto"``/empty -> None (derive from observed lengths); ``"16,32,64"`` -> [16, 32, 64]."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        items = [int(v) for v in value]
    else:
        s = str(value).strip().lower()
        if s in ("", "auto"):
            return None
        try:
            items = [int(p) for p in s.replace(" ", "").split(",") if p]
        except ValueError as e:
            raise ConfigError(f"buckets must be 'auto' or a comma list of integers, got {value!r}") from e
    if not items or any(b <= 0 for b in items):
        raise ConfigError(f"buckets must be positive integers, got {value!r}")
    return sorted(set(items))


@dataclass(frozen=True)
class Opt:
    """Metadata for one setting."""

    help: str
    type: str = "str"  # str | int | float | bool | buckets
    choices: tuple[str, ...] | None = None


def _opt(default: Any, help: str, type: str = "str", choices: tuple[str, ...] | None = None) -> Any:
    return field(default=default, metadata={"opt": Opt(help=help, type=type, choices=choices)})


@dataclass
class Settings:
    # --- model -----------------------------------------------------------------------------
    model_uri: str = _opt("", "model location: a path, file://..., http(s)://... or noop://")
    model_name: str = _opt("", "model name served under /v2/models/{name}")
    model_version: str = _opt("1", "model version string")
    model_format: str = _opt(
        "auto",
        "model format",
        choices=("auto", "hf", "torchscript", "export", "custom", "noop"),
    )
    model_sha256: str = _opt(
        "", "expected sha256 of the model file, or the directory digest (see docs/server.md)"
    )
    task: str = _opt("auto", "task of a Hugging Face model", choices=("auto", "embedding", "classification"))
    handler: str = _opt("", "custom handler 'path/to/file.py:ClassName' or 'package.module:ClassName'")
    download_dir: str = _opt("", "where http(s) models are downloaded (default: a temporary directory)")
    # --- network ---------------------------------------------------------------------------
    host: str = _opt("0.0.0.0", "listen address")
    port: int = _opt(8080, "listen port", "int")
    # --- device ----------------------------------------------------------------------------
    device: str = _opt("auto", "inference device", choices=("auto", "cpu", "cuda"))
    dtype: str = _opt(
        "fp32", "weights/activation dtype (fp16/bf16 only on CUDA)", choices=("fp32", "fp16", "bf16")
    )
    num_threads: int = _opt(0, "torch intra-op threads on CPU (0 = torch default)", "int")
    # --- batching --------------------------------------------------------------------------
    max_batch_size: int = _opt(64, "maximum items per batch", "int")
    max_queue_delay_ms: float = _opt(
        5.0, "longest time the oldest queued item waits for a batch to fill", "float"
    )
    max_queue_size: int = _opt(1024, "maximum queued items; beyond it requests get 503", "int")
    max_sequence_length: int = _opt(0, "maximum tokens per text input (0 = the model's limit)", "int")
    truncate: bool = _opt(False, "truncate over-long texts instead of rejecting them (413)", "bool")
    buckets: list[int] | None = _opt(  # noqa: RUF009 - immutable default
        None, "length bucket upper bounds, comma list, or 'auto'", "buckets"
    )
    token_budget: int = _opt(8192, "maximum padded tokens (batch size x padded length) per batch", "int")
    scheduler: str = _opt(
        "adaptive",
        "batch formation: adaptive (buckets + token budget + cost model, bounded passing-over),"
        " adaptive-v1 (the adaptive scheduler before the tail bound, for comparison) or fifo (plain"
        " dynamic batching)",
        choices=("adaptive", "adaptive-v1", "fifo"),
    )
    priority_levels: int = _opt(3, "number of priority levels (1 = highest)", "int")
    default_priority: int = _opt(2, "priority of requests that do not set one", "int")
    aging_ms: float = _opt(100.0, "queue wait that raises a request's priority by one level", "float")
    default_timeout_ms: float = _opt(10000.0, "per-request deadline when the caller sets none", "float")
    max_timeout_ms: float = _opt(60000.0, "cap for a caller-supplied timeout", "float")
    warmup: bool = _opt(True, "run warm-up batches for every bucket before reporting ready", "bool")
    # --- misc ------------------------------------------------------------------------------
    shadow_file: str = _opt(
        "",
        "file naming the shadow revision to copy a sample of answered requests to (JSON; in a pod, the"
        " downward-API volume of the annotation modeldeploy.io/shadow); empty = never copy",
    )
    cache_size: int = _opt(0, "LRU result cache entries (0 = off)", "int")
    drain_timeout_s: float = _opt(0.0, "SIGTERM drain limit (0 = max timeout + 5 s)", "float")
    log_level: str = _opt("info", "log level", choices=("debug", "info", "warning", "error"))
    log_batch_every: int = _opt(100, "log a summary for one batch in N (0 = never)", "int")

    # ------------------------------------------------------------------------------------------
    def validate(self) -> Settings:
        if self.model_format != "noop" and not self.model_uri:
            raise ConfigError("model_uri is required (--model-uri or MODELSERVER_MODEL_URI)")
        if not self.model_name:
            raise ConfigError("model_name is required (--model-name or MODELSERVER_MODEL_NAME)")
        if "/" in self.model_name or "/" in self.model_version:
            raise ConfigError("model name and version must not contain '/'")
        positive = ("max_batch_size", "max_queue_size", "token_budget", "priority_levels")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1")
        if not 0 <= self.port <= 65535:
            raise ConfigError("port must be in 0..65535")
        if self.max_queue_delay_ms < 0 or self.aging_ms <= 0:
            raise ConfigError("max_queue_delay_ms must be >= 0 and aging_ms > 0")
        if self.default_timeout_ms <= 0 or self.max_timeout_ms <= 0:
            raise ConfigError("timeouts must be > 0")
        if self.default_timeout_ms > self.max_timeout_ms:
            raise ConfigError("default_timeout_ms must not exceed max_timeout_ms")
        if not 1 <= self.default_priority <= self.priority_levels:
            raise ConfigError("default_priority must be within 1..priority_levels")
        if self.max_sequence_length < 0 or self.cache_size < 0 or self.num_threads < 0:
            raise ConfigError("max_sequence_length, cache_size and num_threads must be >= 0")
        if self.model_sha256 and (
            len(self.model_sha256) != 64
            or any(c not in "0123456789abcdef" for c in self.model_sha256.lower())
        ):
            raise ConfigError("model_sha256 must be 64 hex digits")
        return self

    def public(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _fields() -> list[dataclasses.Field[Any]]:
    return list(dataclasses.fields(Settings))


def _convert(name: str, opt: Opt, value: Any) -> Any:
    try:
        if opt.type == "int":
            out: Any = int(value)
        elif opt.type == "float":
            out = float(value)
        elif opt.type == "bool":
            out = _parse_bool(value)
        elif opt.type == "buckets":
            out = _parse_buckets(value)
        else:
            out = str(value)
    except ConfigError as e:
        raise ConfigError(f"{name}: {e}") from e
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{name}: invalid {opt.type} value {value!r}") from e
    if opt.choices is not None and out not in opt.choices:
        raise ConfigError(f"{name}: {out!r} is not one of {', '.join(opt.choices)}")
    return out


def env_var(name: str) -> str:
    return ENV_PREFIX + name.upper()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m modelserver",
        description="Dynamic-batching inference server (Open Inference Protocol v2). "
        f"Every flag can also be set as {ENV_PREFIX}<NAME> or in the --config file.",
    )
    p.add_argument("--config", default=None, help=f"YAML or JSON settings file (env {ENV_PREFIX}CONFIG)")
    for f in _fields():
        opt: Opt = f.metadata["opt"]
        flag = "--" + f.name.replace("_", "-")
        extra = f" (env {env_var(f.name)}; default {f.default!r})"
        if opt.choices:
            extra = f" [{'|'.join(opt.choices)}]" + extra
        # Defaults are None so that "not given" can be told from "given the default".
        p.add_argument(flag, dest=f.name, default=None, help=opt.help + extra, metavar=f.name.upper())
    return p


def load_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    text = Path(path).read_text()
    if str(path).endswith(".json"):
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def load_settings(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Resolve settings: flag > env > file > default."""
    environ = os.environ if environ is None else environ
    args = build_parser().parse_args(argv)
    cfg_path = args.config or environ.get(ENV_PREFIX + "CONFIG")
    file_values = load_file(cfg_path) if cfg_path else {}
    known = {f.name for f in _fields()}
    unknown = set(file_values) - known
    if unknown:
        raise ConfigError(f"unknown setting(s) in {cfg_path}: {', '.join(sorted(unknown))}")
    values: dict[str, Any] = {}
    for f in _fields():
        opt: Opt = f.metadata["opt"]
        raw: Any = getattr(args, f.name)
        if raw is None:
            raw = environ.get(env_var(f.name))
        if raw is None and f.name in file_values:
            raw = file_values[f.name]
        if raw is not None:
            values[f.name] = _convert(f.name, opt, raw)
    return Settings(**values).validate()


def settings_table() -> list[tuple[str, str, str, str]]:
    """(flag, env var, default, help) rows, used by docs."""
    rows = []
    for f in _fields():
        opt: Opt = f.metadata["opt"]
        rows.append(("--" + f.name.replace("_", "-"), env_var(f.name), repr(f.default), opt.help))
    return rows
