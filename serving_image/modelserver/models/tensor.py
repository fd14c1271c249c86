"""Tensor models: TorchScript (``torch.jit.save`` archives) and ``torch.export`` programs (``.pt2``).

The model is called with one batched tensor per input, in signature order; its output is a tensor, or a
tuple/list of tensors, whose first dimension is the batch.

Signature: a ``signature.json`` in the model directory (or ``<file>.signature.json`` beside a file)::

    {"inputs":  [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
     "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}]}

Without one: inputs ``input__0..`` (from the exported program's example inputs when there are some,
else one FP32 input of shape [-1, -1]) and outputs ``output__0..``, named like Triton's PyTorch backend.

Rows with different shapes (for ``-1`` dimensions) never share a batch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InvalidInput, ModelLoadError
from .base import DTYPES, ModelInfo, Prepared, ServedModel, TensorSpec, batch_size_of

TORCH_DTYPES = {"FP32": "float32", "FP16": "float16", "FP64": "float64", "INT64": "int64", "INT32": "int32"}


def read_signature(model_file: Path) -> tuple[list[TensorSpec], list[TensorSpec]] | None:
    for cand in (
        model_file.with_name(model_file.name + ".signature.json"),
        model_file.parent / "signature.json",
    ):
        if cand.is_file():
            try:
                sig = json.loads(cand.read_text())
                ins = [
                    TensorSpec(d["name"], d["datatype"], [int(x) for x in d["shape"]]) for d in sig["inputs"]
                ]
                outs = [
                    TensorSpec(d["name"], d["datatype"], [int(x) for x in d["shape"]]) for d in sig["outputs"]
                ]
            except (ValueError, KeyError, TypeError) as e:
                raise ModelLoadError(f"bad signature file {cand}: {e}") from e
            for s in ins + outs:
                if s.datatype not in TORCH_DTYPES:
                    raise ModelLoadError(f"signature {cand}: datatype {s.datatype} not supported for tensors")
            return ins, outs
    return None


class TensorModel(ServedModel):
    def __init__(self, path: Path, kind: str, device: str = "cpu", dtype: str = "fp32") -> None:
        self.path = path  # the model file
        self.kind = kind  # torchscript | export
        self.device = device
        self.dtype = dtype

    def load(self) -> None:
        import torch

        self.torch = torch
        example: tuple[Any, ...] = ()
        try:
            if self.kind == "torchscript":
                module = torch.jit.load(str(self.path), map_location=self.device)
                module.eval()
                self.fn = module
            else:
                ep = torch.export.load(str(self.path))
                ex_args: Any = getattr(ep, "example_inputs", None) or ((), {})
                example = tuple(ex_args[0] or ())
                module = ep.module()
                module.to(self.device)
                self.fn = module
        except Exception as e:
            raise ModelLoadError(f"cannot load {self.kind} model {self.path}: {e}") from e
        sig = read_signature(self.path)
        if sig is None:
            ins = []
            rev = {v: k for k, v in TORCH_DTYPES.items()}
            for i, t in enumerate(example):
                dt = rev.get(str(t.dtype).replace("torch.", ""), "FP32")
                ins.append(TensorSpec(f"input__{i}", dt, [-1, *list(t.shape[1:])]))
            if not ins:
                ins = [TensorSpec("input__0", "FP32", [-1, -1])]
            outs = self._probe_outputs(ins)
        else:
            ins, outs = sig
        self.info = ModelInfo(platform=f"pytorch_{self.kind}", inputs=ins, outputs=outs, max_length=1)

    def _probe_outputs(self, ins: list[TensorSpec]) -> list[TensorSpec]:
        """Run one row of zeros (when every shape is known) to name and shape the outputs."""
        if any(d == -1 for s in ins for d in s.shape[1:]):
            return [TensorSpec("output__0", "FP32", [-1, -1])]
        payload = tuple(np.zeros(s.shape[1:], dtype=DTYPES[s.datatype]) for s in ins)
        try:
            res = self._run([payload])
        except Exception as e:
            raise ModelLoadError(f"the model failed on a probe input: {e}") from e
        rev = {v: k for k, v in TORCH_DTYPES.items()}
        return [
            TensorSpec(f"output__{i}", rev.get(str(t.dtype), "FP32"), [-1, *list(t.shape[1:])])
            for i, t in enumerate(res)
        ]

    def preprocess(self, inputs: dict[str, np.ndarray]) -> list[Prepared]:
        n = batch_size_of(inputs, self.info.inputs)
        arrays = []
        for spec in self.info.inputs:
            arr = inputs[spec.name]
            want = np.dtype(DTYPES[spec.datatype])
            if arr.dtype != want:
                raise InvalidInput(f"input '{spec.name}' must be {spec.datatype}")
            arrays.append(arr)
        key = tuple(a.shape[1:] for a in arrays)
        return [Prepared(payload=tuple(a[i] for a in arrays), length=1, key=key) for i in range(n)]

    def _run(self, payloads: list[Any]) -> list[np.ndarray]:
        torch = self.torch
        tensors = [
            torch.from_numpy(np.ascontiguousarray(np.stack([p[j] for p in payloads]))).to(self.device)
            for j in range(len(payloads[0]))
        ]
        with torch.inference_mode():
            out = self.fn(*tensors)
        if isinstance(out, torch.Tensor):
            out = (out,)
        elif isinstance(out, dict):
            out = tuple(out.values())
        return [o.detach().cpu().numpy() for o in out]

    def predict(self, payloads: list[Any]) -> Sequence[dict[str, np.ndarray]]:
        res = self._run(payloads)
        names = [s.name for s in self.info.outputs]
        if len(res) != len(names):
            names = [f"output__{i}" for i in range(len(res))]
        for r in res:
            if r.shape[:1] != (len(payloads),):
                raise RuntimeError(
                    f"model output has shape {list(r.shape)}; the first dimension must be the batch"
                )
        return [{name: r[i] for name, r in zip(names, res, strict=True)} for i in range(len(payloads))]

    def warmup_payloads(self, length: int, n: int) -> list[Any]:
        if any(d == -1 for s in self.info.inputs for d in s.shape[1:]):
            return []
        return [tuple(np.zeros(s.shape[1:], dtype=DTYPES[s.datatype]) for s in self.info.inputs)] * n
