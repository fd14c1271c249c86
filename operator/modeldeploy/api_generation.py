"""``spec.generation``: the continuous-batching engine's sizes for ``spec.model.task: generation``
(modelserver.gen_engine), what vLLM users set as ``--num-gpu-blocks``/``--max-num-batched-tokens``/
``--max-num-seqs``. Each becomes the server's ``MODELSERVER_*`` setting of the same meaning; unset, the
server's defaults (the same numbers)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .api_base import ApiModel


class GenerationSpec(ApiModel):
    """Sizes of the text generation engine (only for spec.model.task generation)."""

    kv_cache_tokens: int = Field(
        default=16384,
        ge=64,
        le=16_777_216,
        description="KV cache size in tokens, all sequences together; it also caps the context (prompt plus"
        " answer). Past it, requests wait; past maxWaitingSequences, they get 429.",
    )
    kv_page_size: int = Field(default=32, ge=1, le=4096, description="Tokens per KV cache block.")
    max_batch_tokens: int = Field(
        default=512,
        ge=1,
        le=1_048_576,
        description="Tokens per engine step, prefill chunks and decode steps together: a long prompt is"
        " prefilled in chunks, so running streams keep their pace.",
    )
    max_running_sequences: int = Field(default=32, ge=1, le=4096, description="Sequences in one engine step.")
    max_waiting_sequences: int = Field(
        default=64,
        ge=0,
        le=65536,
        description="Sequences admitted and not started; beyond, 429 + Retry-After.",
    )
    max_new_tokens: int = Field(default=1024, ge=1, le=1_048_576, description="max_tokens a request may ask.")
    engine: Literal["auto", "own", "manager"] = Field(
        default="auto",
        description="The loop that runs the model: own (slot-based KV cache; on the CPU 2.03x transformers"
        " serve at 32 streams) or manager (transformers' ContinuousBatchingManager, paged); auto = own on the"
        " CPU, manager on a GPU (where the own engine is not measured yet).",
    )
    max_context_tokens: int = Field(
        default=0,
        ge=0,
        le=16_777_216,
        description="engine own: tokens of one sequence (prompt plus answer), the KV cache's slot length; the"
        " cache then holds kvCacheTokens / this sequences at once. 0 = kvCacheTokens / maxRunningSequences.",
    )

    def server_env(self) -> dict[str, str]:
        return {
            "MODELSERVER_KV_CACHE_TOKENS": str(self.kv_cache_tokens),
            "MODELSERVER_KV_PAGE_SIZE": str(self.kv_page_size),
            "MODELSERVER_MAX_BATCH_TOKENS": str(self.max_batch_tokens),
            "MODELSERVER_MAX_RUNNING_SEQUENCES": str(self.max_running_sequences),
            "MODELSERVER_MAX_WAITING_SEQUENCES": str(self.max_waiting_sequences),
            "MODELSERVER_MAX_NEW_TOKENS": str(self.max_new_tokens),
            "MODELSERVER_ENGINE": self.engine,
            "MODELSERVER_MAX_CONTEXT_TOKENS": str(self.max_context_tokens),
        }
