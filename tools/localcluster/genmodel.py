"""A small causal language model for the generation tests, built offline: nothing is downloaded.

* The tokenizer is a byte-level BPE (``tokenizers``) trained on text already on this machine (Debian's
  ``/usr/share/common-licenses`` and the Python standard library's sources), wrapped as a
  ``PreTrainedTokenizerFast`` with ``<s>``/``</s>``/``<pad>`` and a chat template.
* The model is a ``LlamaForCausalLM`` (grouped-query attention, RoPE, like most checkpoints shipped today)
  with random weights from ``torch.manual_seed(seed)``: another seed is another, "wrong" revision.
  ``initializer_range`` 0.1 rather than the default 0.02: at 0.02 a random Llama's greedy answer is one
  token repeated, which makes "the same answer" meaningless; at 0.1 answers vary with the prompt.

``size="test"`` (2 layers, hidden 128: 1.4 M parameters, built in seconds) is for unit and
integration tests; ``size="bench"`` (6 layers, hidden 512: 25.6 M parameters) is big enough that compute
dominates (the benchmarks, the e2e tier).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sysconfig
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
SIZES: dict[str, dict[str, Any]] = {
    "test": {"hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2},
    "bench": {"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 6, "num_attention_heads": 8,
              "num_key_value_heads": 4},
}  # fmt: skip


def corpus_files(max_bytes: int = 1_000_000) -> list[str]:
    """Local text, in a fixed order: the licenses, then the standard library's sources."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    candidates = sorted(Path("/usr/share/common-licenses").glob("*")) + sorted(stdlib.glob("*.py"))
    out: list[str] = []
    total = 0
    for f in candidates:
        if f.is_file() and f.stat().st_size > 0:
            out.append(str(f))
            total += f.stat().st_size
            if total >= max_bytes:
                break
    if not out:
        raise RuntimeError("no local text to train the tokenizer on")
    return out


def build_tokenizer(vocab_size: int = 4000) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(corpus_files(), trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=["<|system|>", "<|user|>", "<|assistant|>"],
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def build(out: Path, seed: int = 0, size: str = "test", max_positions: int = 2048) -> Path:
    """Write a tokenizer and a random ``LlamaForCausalLM`` (seeded) to ``out``; returns ``out``."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tok = build_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tok),
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        initializer_range=0.1,
        **SIZES[size],
    )
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def cached(seed: int = 0, size: str = "test") -> Path:
    """:func:`build`, once per machine: under ``$MODELDEPLOY_GENMODEL_CACHE`` (default
    ``~/.cache/modeldeploy/genmodels``), keyed by this module's text, the seed and the size."""
    key = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    root = Path(
        os.environ.get("MODELDEPLOY_GENMODEL_CACHE", Path.home() / ".cache" / "modeldeploy" / "genmodels")
    )
    out = root / f"{size}-{seed}-{key}"
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        return out
    tmp = root / f".{out.name}.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    build(tmp, seed, size)
    try:
        tmp.rename(out)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return out
