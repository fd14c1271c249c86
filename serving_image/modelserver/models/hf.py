"""Hugging Face style directories: ``config.json`` + ``model.safetensors`` + ``tokenizer.json``.

Tasks:

* ``embedding``: the base model's last hidden state, pooled as the directory's sentence-transformers
  ``1_Pooling/config.json`` says (mean pooling when absent) and L2-normalised when ``modules.json`` lists a
  ``Normalize`` module (as for all-MiniLM-L6-v2). Output ``embedding`` FP32 [-1, hidden].
* ``classification``: ``AutoModelForSequenceClassification``; outputs ``logits`` FP32 [-1, classes],
  ``probabilities`` FP32 [-1, classes] and ``label`` BYTES [-1] (``id2label`` of the arg-max).

Only safetensors weights are read (``use_safetensors=True``); pickled ``*.bin`` files are never loaded, no
remote code runs and nothing is downloaded (local files only).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..batching import InputTooLong
from ..errors import ModelLoadError
from .base import ModelInfo, Prepared, ServedModel, TensorSpec, batch_size_of, texts_of
from .hf_packed import TOLERANCE, largest_difference, packed_embeddings
from .wordcount import exceeds_words

log = logging.getLogger("modelserver.models")


def is_hf_dir(path: Path) -> bool:
    return (
        path.is_dir()
        and (path / "config.json").is_file()
        and ((path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file())
    )


def detect_task(path: Path) -> str:
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read {path / 'config.json'}: {e}") from e
    archs = cfg.get("architectures") or []
    if any(str(a).endswith("ForSequenceClassification") for a in archs):
        return "classification"
    return "embedding"


class HFModel(ServedModel):
    def __init__(
        self,
        path: Path,
        task: str = "auto",
        device: str = "cpu",
        dtype: str = "fp32",
        max_length: int = 0,
        truncate: bool = False,
        packing: str = "auto",
    ) -> None:
        self.path = path
        self.packing = packing  # auto | on | off (modelserver.packing; decided at load, see _decide_packing)
        self.packed = False
        self.task = detect_task(path) if task == "auto" else task
        self.device = device
        self.dtype = dtype
        self.requested_max_length = max_length
        self.truncate = truncate

    # -- loading ----------------------------------------------------------------------------------------
    def load(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        import torch
        from tokenizers import Tokenizer
        from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.torch = torch
        tok_file = self.path / "tokenizer.json"
        if not tok_file.is_file():
            raise ModelLoadError(f"{self.path} has no tokenizer.json")
        tok = Tokenizer.from_file(str(tok_file))
        tok.no_truncation()
        tok.no_padding()
        self.tokenizer = tok
        config = AutoConfig.from_pretrained(str(self.path), local_files_only=True, trust_remote_code=False)
        limit = int(getattr(config, "max_position_embeddings", 512) or 512)
        try:
            tcfg = json.loads((self.path / "tokenizer_config.json").read_text())
            mml = int(tcfg.get("model_max_length", limit))
            if 0 < mml < limit:
                limit = mml
        except (OSError, ValueError, TypeError):
            pass
        if self.requested_max_length and self.requested_max_length > limit:
            raise ModelLoadError(
                f"max_sequence_length {self.requested_max_length} exceeds the model's limit {limit}"
            )
        self.max_length = self.requested_max_length or limit
        torch_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[self.dtype]
        cls = AutoModelForSequenceClassification if self.task == "classification" else AutoModel
        try:
            model = cls.from_pretrained(
                str(self.path),
                local_files_only=True,
                use_safetensors=True,
                trust_remote_code=False,
                dtype=torch_dtype,
            )
        except Exception as e:  # transformers raises many types
            raise ModelLoadError(f"cannot load Hugging Face model from {self.path}: {e}") from e
        model.eval()
        model.to(self.device)
        self.model = model
        import inspect

        self._takes_token_types = "token_type_ids" in inspect.signature(model.forward).parameters
        self.pad_id = int(getattr(config, "pad_token_id", 0) or 0)
        if self.task == "embedding":
            self._setup_pooling()
            self.packed = self._decide_packing()
            hidden = int(config.hidden_size)
            outputs = [TensorSpec("embedding", "FP32", [-1, hidden])]
        else:
            id2label = getattr(config, "id2label", None) or {}
            self.num_labels = int(config.num_labels)
            self.labels = [str(id2label.get(i, id2label.get(str(i), i))) for i in range(self.num_labels)]
            outputs = [
                TensorSpec("logits", "FP32", [-1, self.num_labels]),
                TensorSpec("probabilities", "FP32", [-1, self.num_labels]),
                TensorSpec("label", "BYTES", [-1]),
            ]
        self.info = ModelInfo(
            platform=f"pytorch_hf_{self.task}",
            inputs=[TensorSpec("text", "BYTES", [-1])],
            outputs=outputs,
            max_length=self.max_length,
            extra={"task": self.task, "max_sequence_length": self.max_length, "packed": self.packed},
        )

    def _setup_pooling(self) -> None:
        self.pooling = "mean"
        self.normalize = False
        modules = self.path / "modules.json"
        if modules.is_file():
            try:
                mods = json.loads(modules.read_text())
            except ValueError as e:
                raise ModelLoadError(f"bad modules.json: {e}") from e
            for m in mods:
                t = str(m.get("type", ""))
                if t.endswith("Normalize"):
                    self.normalize = True
                if t.endswith("Pooling"):
                    pcfg = self.path / str(m.get("path", "1_Pooling")) / "config.json"
                    if pcfg.is_file():
                        p = json.loads(pcfg.read_text())
                        if p.get("pooling_mode_cls_token"):
                            self.pooling = "cls"
                        elif p.get("pooling_mode_max_tokens"):
                            self.pooling = "max"
                        elif p.get("pooling_mode_mean_sqrt_len_tokens"):
                            self.pooling = "mean_sqrt_len"

    def _decide_packing(self) -> bool:
        """Whether batches run packed (:mod:`modelserver.packing`): never with ``off``; with ``auto`` on the
        CPU only (not measured on a GPU); and only if the packed forward gives the padded forward's
        embeddings on inputs of different lengths -- with ``on`` a model that does not is a load error."""
        if self.packing == "off" or (self.packing == "auto" and self.device != "cpu"):
            return False
        texts = [
            "packing",
            "a check of packed rows",
            "one two three four five six seven eight nine ten",
            "ok",
        ]
        payloads = [self.tokenizer.encode(t).ids[: self.max_length] for t in texts]
        try:
            diff = largest_difference(self._packed_embeddings(payloads), self._padded_embeddings(payloads))
            reason = (
                "" if diff <= TOLERANCE[self.dtype] else f"packed embeddings differ from padded by {diff:.2e}"
            )
        except Exception as e:  # a forward without position_ids or 4-D masks raises many types
            reason = f"the model's forward does not run packed: {type(e).__name__}: {e}"
        if not reason:
            log.info("sequence packing on for %s", self.path.name)
            return True
        if self.packing == "on":
            raise ModelLoadError(f"packing on, but {reason}")
        log.info("sequence packing off for %s: %s", self.path.name, reason)
        return False

    # -- serving ----------------------------------------------------------------------------------------
    def preprocess(self, inputs: dict[str, np.ndarray]) -> list[Prepared]:
        batch_size_of(inputs, self.info.inputs)
        texts = texts_of(inputs["text"], "text")
        if not self.truncate:
            for i, text in enumerate(texts):
                if exceeds_words(text, self.max_length):
                    # refused before tokenizing: more words than tokens allowed (modelserver.models.wordcount)
                    raise InputTooLong(
                        f"input {i} has more than {self.max_length} words, more than the maximum sequence "
                        f"length {self.max_length} tokens"
                    )
        out = []
        encs = self.tokenizer.encode_batch(texts) if len(texts) > 1 else [self.tokenizer.encode(texts[0])]
        for i, enc in enumerate(encs):
            ids = enc.ids
            if len(ids) > self.max_length:
                if not self.truncate:
                    raise InputTooLong(
                        f"input {i} has {len(ids)} tokens, more than the maximum sequence length "
                        f"{self.max_length}"
                    )
                ids = [*ids[: self.max_length - 1], ids[-1]]  # keep the final [SEP]
            out.append(Prepared(payload=ids, length=len(ids), cache_key=texts[i]))
        return out

    def _collate(self, payloads: list[Any]) -> dict[str, Any]:
        torch = self.torch
        n = len(payloads)
        length = max(len(p) for p in payloads)
        ids = np.full((n, length), self.pad_id, dtype=np.int64)
        mask = np.zeros((n, length), dtype=np.int64)
        for i, p in enumerate(payloads):
            ids[i, : len(p)] = p
            mask[i, : len(p)] = 1
        feed = {
            "input_ids": torch.from_numpy(ids).to(self.device),
            "attention_mask": torch.from_numpy(mask).to(self.device),
        }
        if self._takes_token_types:
            feed["token_type_ids"] = torch.zeros_like(feed["input_ids"])
        return feed

    def predict(self, payloads: list[Any]) -> Sequence[dict[str, Any]]:
        try:
            return self._predict(payloads)
        except self.torch.cuda.OutOfMemoryError:
            self.torch.cuda.empty_cache()  # release the failed batch's blocks before the split retry
            raise

    def _predict(self, payloads: list[Any]) -> Sequence[dict[str, Any]]:
        if self.task == "embedding":
            emb = self._packed_embeddings(payloads) if self.packed else self._padded_embeddings(payloads)
            return [{"embedding": emb[i]} for i in range(len(payloads))]
        torch = self.torch
        feed = self._collate(payloads)
        with torch.inference_mode():
            out = self.model(**feed)
            logits = out.logits.float()
            probs = torch.softmax(logits, dim=-1).cpu().numpy()
            lg = logits.cpu().numpy()
            best = probs.argmax(axis=1)
            return [
                {"logits": lg[i], "probabilities": probs[i], "label": self.labels[int(best[i])]}
                for i in range(len(payloads))
            ]

    def _padded_embeddings(self, payloads: Sequence[Sequence[int]]) -> np.ndarray:
        """Embeddings of a padded batch: every input padded to the longest, pooled over its own tokens."""
        torch = self.torch
        feed = self._collate(list(payloads))
        with torch.inference_mode():
            h = self.model(**feed).last_hidden_state
            mask = feed["attention_mask"].unsqueeze(-1).to(h.dtype)
            if self.pooling == "cls":
                pooled = h[:, 0]
            elif self.pooling == "max":
                pooled = h.masked_fill(mask == 0, -1e9).max(dim=1).values
            else:
                summed = (h * mask).sum(dim=1)
                counts = mask.sum(dim=1).clamp(min=1e-9)
                pooled = summed / (counts.sqrt() if self.pooling == "mean_sqrt_len" else counts)
            pooled = pooled.float()
            if self.normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
            return np.asarray(pooled.cpu().numpy())

    def _packed_embeddings(self, payloads: Sequence[Sequence[int]]) -> np.ndarray:
        """Embeddings of a packed batch (:mod:`modelserver.packing`): the same pooling, fewer positions."""
        return packed_embeddings(
            self.torch,
            self.model,
            payloads,
            pad_id=self.pad_id,
            device=self.device,
            pooling=self.pooling,
            normalize=self.normalize,
            token_types=self._takes_token_types,
        )

    def warmup_payloads(self, length: int, n: int) -> list[Any]:
        length = max(2, min(length, self.max_length))
        cls_id = self.tokenizer.token_to_id("[CLS]") or 101
        sep_id = self.tokenizer.token_to_id("[SEP]") or 102
        filler = self.tokenizer.token_to_id("the") or 1996
        return [[cls_id] + [filler] * (length - 2) + [sep_id]] * n
