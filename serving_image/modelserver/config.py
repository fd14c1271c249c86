"""Server settings (pydantic-settings): command-line flags, environment variables and one config file.

Precedence, highest first: command-line flag > environment variable > config file > default.

Every setting ``foo_bar`` is
  * the flag ``--foo-bar``,
  * the environment variable ``MODELSERVER_FOO_BAR``,
  * the key ``foo_bar`` (or ``foo-bar``) in the YAML/JSON file given by ``--config`` /
    ``MODELSERVER_CONFIG``.

Each layer is a pydantic-settings source (``CliSettingsSource``, ``EnvSettingsSource``,
``YamlConfigSettingsSource`` / ``JsonConfigSettingsSource``); :func:`load_settings` stacks them in that
order and pydantic validates the result. This module imports nothing heavy (no torch), so ``--help`` and
configuration errors are instant.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    CliSettingsSource,
    EnvSettingsSource,
    JsonConfigSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

ENV_PREFIX = "MODELSERVER_"


class ConfigError(ValueError):
    """A setting is missing or invalid."""


def _parse_buckets(value: Any) -> list[int] | None:
    """``"auto"``/empty -> None (derive from observed lengths); ``"16,32,64"`` or a list -> [16, 32, 64]."""
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
        except ValueError:
            raise ValueError(f"buckets must be 'auto' or a comma list of integers, got {value!r}") from None
    if not items or any(b <= 0 for b in items):
        raise ValueError(f"buckets must be positive integers, got {value!r}")
    return sorted(set(items))


#: "auto", "16,64,256" or a list; read as text from flags and the environment (``NoDecode``: not as JSON)
Buckets = Annotated[list[int] | None, NoDecode, BeforeValidator(_parse_buckets)]


class Settings(BaseSettings):
    """
    Dynamic-batching inference server (Open Inference Protocol v2). Every flag can also be set as
    MODELSERVER_<NAME> or as a key of the --config file; precedence: flag > environment > file > default.
    """

    # Constructed directly (``Settings(model_name=...)``) it takes only the given values and the defaults;
    # load_settings() stacks flags, environment and config file.

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        cli_prog_name="python -m modelserver",
        cli_kebab_case=True,
        cli_exit_on_error=True,
        cli_show_env_vars=True,
        cli_hide_none_type=True,
    )

    config: str = Field("", description="YAML or JSON settings file")
    # --- model -----------------------------------------------------------------------------
    model_uri: str = Field("", description="model location: a path, file://..., http(s)://... or noop://")
    model_name: str = Field("", description="model name served under /v2/models/{name}")
    model_version: str = Field("1", description="model version string")
    model_format: Literal["auto", "hf", "torchscript", "export", "custom", "noop"] = Field(
        "auto", description="model format"
    )
    model_sha256: str = Field(
        "",
        pattern=r"^([0-9a-fA-F]{64})?$",
        description="expected sha256 of the model file, or the directory digest (see docs/server.md)",
    )
    task: Literal["auto", "embedding", "classification", "generation"] = Field(
        "auto", description="task of a Hugging Face model (auto: generation for a *ForCausalLM config)"
    )
    handler: str = Field(
        "", description="custom handler 'path/to/file.py:ClassName' or 'package.module:ClassName'"
    )
    download_dir: str = Field(
        "", description="where http(s) models are downloaded (default: a temporary directory)"
    )
    # --- network ---------------------------------------------------------------------------
    host: str = Field("0.0.0.0", description="listen address")
    port: int = Field(8080, ge=0, le=65535, description="listen port")
    # --- device ----------------------------------------------------------------------------
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="inference device")
    dtype: Literal["fp32", "fp16", "bf16"] = Field(
        "fp32", description="weights/activation dtype (fp16/bf16 only on CUDA)"
    )
    num_threads: int = Field(0, ge=0, description="torch intra-op threads on CPU (0 = torch default)")
    # --- batching --------------------------------------------------------------------------
    max_batch_size: int = Field(64, ge=1, description="maximum items per batch")
    max_queue_delay_ms: float = Field(
        5.0, ge=0, description="longest time the oldest queued item waits for a batch to fill"
    )
    max_queue_size: int = Field(1024, ge=1, description="maximum queued items; beyond it requests get 503")
    max_concurrent_requests: int = Field(
        128,
        ge=1,
        description="infer requests inside the server at once, from their arrival to their answer (reading,"
        " decoding, queued, running); beyond it the door answers 503 with Retry-After at once",
    )
    max_sequence_length: int = Field(
        0, ge=0, description="maximum tokens per text input (0 = the model's limit)"
    )
    truncate: bool = Field(False, description="truncate over-long texts instead of rejecting them (413)")
    packing: Literal["auto", "on", "off"] = Field(
        "auto",
        description="embedding models: run batches packed (several inputs per row, no padding between them;"
        " modelserver.packing) -- auto = on the CPU when the packed forward matches the padded one at load,"
        " on = on any device (a model that does not match is a load error), off = padded",
    )
    buckets: Buckets = Field(None, description="length bucket upper bounds, comma list, or 'auto'")
    token_budget: int = Field(
        8192, ge=1, description="maximum padded tokens (batch size x padded length) per batch"
    )
    scheduler: Literal["adaptive", "fifo"] = Field(
        "adaptive",
        description="batch formation: adaptive (buckets + token budget + cost model, bounded passing-over)"
        " or fifo (plain dynamic batching, for comparison)",
    )
    priority_levels: int = Field(3, ge=1, description="number of priority levels (1 = highest)")
    default_priority: int = Field(2, description="priority of requests that do not set one")
    aging_ms: float = Field(
        100.0, gt=0, description="queue wait that raises a request's priority by one level"
    )
    default_timeout_ms: float = Field(
        10000.0, gt=0, description="per-request deadline when the caller sets none"
    )
    max_timeout_ms: float = Field(60000.0, gt=0, description="cap for a caller-supplied timeout")
    warmup: bool = Field(True, description="run warm-up batches for every bucket before reporting ready")
    # --- generation (task generation: the continuous-batching engine, modelserver.gen_engine) ---
    engine: Literal["auto", "own", "manager"] = Field(
        "auto",
        description="generation: the loop that runs the model -- own (modelserver.gen_own_engine: slot-based"
        " KV cache) or manager (transformers' ContinuousBatchingManager: paged KV cache); auto = own on the"
        " CPU, manager on CUDA (the own engine has not been measured on a GPU yet)",
    )
    kv_cache_tokens: int = Field(
        16384,
        ge=64,
        description="generation: KV cache size in tokens (all sequences together; also caps the context)",
    )
    kv_page_size: int = Field(32, ge=1, description="generation: tokens per KV cache block")
    max_context_tokens: int = Field(
        0,
        ge=0,
        description="generation, own engine: tokens of one sequence (prompt + answer), at most -- the KV"
        " cache holds kv-cache-tokens / this sequences at once; 0 = kv-cache-tokens / max-running-sequences",
    )
    max_batch_tokens: int = Field(
        512, ge=1, description="generation: tokens per engine step (prefill chunks and decode steps together)"
    )
    max_running_sequences: int = Field(
        32, ge=1, description="generation: sequences in one engine step, at most"
    )
    max_waiting_sequences: int = Field(
        64, ge=0, description="generation: sequences admitted and not started, at most (beyond: 429)"
    )
    max_new_tokens: int = Field(1024, ge=1, description="generation: max_tokens a request may ask for")
    special_tokens_in_chat: Literal["text", "parse"] = Field(
        "text",
        description="generation: what a chat message's text that spells a special token (a role marker,"
        " the EOS) becomes -- text (plain tokens: a message cannot fake a role) or parse (the special"
        " token itself, as the chat template's own markers)",
    )
    # --- misc ------------------------------------------------------------------------------
    shadow_file: str = Field(
        "",
        description="file naming the shadow revision to copy a sample of answered requests to (JSON; in a"
        " pod, the downward-API volume of the annotation modeldeploy.io/shadow); empty = never copy",
    )
    shadow_service: str = Field(
        "",
        description="where shadow copies may go: an http(s) URL with {revision} where the shadow file's"
        " revision goes (the operator sets http://<ModelDeployment>-{revision}.<namespace>.svc.<cluster"
        " domain>:8080); the shadow file only picks the revision; empty = never copy",
    )
    cache_size: int = Field(0, ge=0, description="LRU result cache entries (0 = off)")
    drain_timeout_s: float = Field(0.0, ge=0, description="SIGTERM drain limit (0 = max timeout + 5 s)")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="log level")
    log_batch_every: int = Field(100, ge=0, description="log a summary for one batch in N (0 = never)")

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as e:
            raise ConfigError(_describe(e)) from None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)  # the layers are load_settings' job

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.model_format != "noop" and not self.model_uri:
            raise ValueError("model_uri is required (--model-uri or MODELSERVER_MODEL_URI)")
        if not self.model_name:
            raise ValueError("model_name is required (--model-name or MODELSERVER_MODEL_NAME)")
        if "/" in self.model_name or "/" in self.model_version:
            raise ValueError("model name and version must not contain '/'")
        if self.default_timeout_ms > self.max_timeout_ms:
            raise ValueError("default_timeout_ms must not exceed max_timeout_ms")
        if not 1 <= self.default_priority <= self.priority_levels:
            raise ValueError("default_priority must be within 1..priority_levels")
        if self.shadow_service and not self.shadow_service.startswith(("http://", "https://")):
            raise ValueError(f"shadow_service must be an http(s) URL, got {self.shadow_service!r}")
        return self


def _describe(e: ValidationError) -> str:
    """One line per error: ``field: message`` (the model-wide checks name their fields themselves)."""
    out = []
    for err in e.errors(include_url=False):
        msg = err["msg"].removeprefix("Value error, ")
        loc = ".".join(str(p) for p in err["loc"])
        out.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(out)


class _Environment(EnvSettingsSource):
    """``MODELSERVER_*`` variables of ``environ`` (the process environment unless a test passes its own)."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {k.lower(): v for k, v in self._environ.items()}


def _file_keys(data: Any, path: Path) -> dict[str, Any]:
    """The file's mapping with ``-`` in keys read as ``_``; unknown keys are an error."""
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping")
    out = {str(k).replace("-", "_"): v for k, v in data.items()}
    unknown = set(out) - set(Settings.model_fields) | ({"config"} & set(out))
    if unknown:
        raise ConfigError(f"unknown setting(s) in {path}: {', '.join(sorted(unknown))}")
    return out


class _YamlFile(YamlConfigSettingsSource):
    def _read_file(self, file_path: Any) -> dict[str, Any]:
        return _file_keys(super()._read_file(file_path), file_path)


class _JsonFile(JsonConfigSettingsSource):
    def _read_file(self, file_path: Any) -> dict[str, Any]:
        return _file_keys(super()._read_file(file_path), file_path)


def load_settings(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Resolve settings: flag > env > file > default (``argv`` without the program name; ``environ``
    defaults to the process environment)."""
    flags: CliSettingsSource[Settings] = CliSettingsSource(
        Settings, cli_parse_args=list(argv) if argv is not None else True
    )
    env = _Environment(Settings, os.environ if environ is None else environ)
    path = flags().get("config") or env().get("config")
    layers: list[PydanticBaseSettingsSource] = [flags, env]
    if path:
        try:
            layers.append(
                _JsonFile(Settings, path) if str(path).endswith(".json") else _YamlFile(Settings, path)
            )
        except (OSError, ValueError) as e:  # unreadable, or not YAML / JSON
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(f"cannot read config file {path}: {e}") from None
    return Settings(_build_sources=(tuple(layers), {}))


def settings_table() -> list[tuple[str, str, str, str]]:
    """(flag, env var, default, help) rows, used by docs."""
    return [
        ("--" + name.replace("_", "-"), ENV_PREFIX + name.upper(), repr(f.default), f.description or "")
        for name, f in Settings.model_fields.items()
    ]
