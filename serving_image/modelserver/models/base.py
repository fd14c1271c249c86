"""The model interface every format implements.

A request's inputs (numpy arrays keyed by input name, first dimension = batch) are split by
:meth:`ServedModel.preprocess` into per-item :class:`Prepared` payloads (one per row), which the batching core
groups into batches for :meth:`ServedModel.predict` (run on the inference thread). Per-item results are
re-assembled into the response tensors by :meth:`ServedModel.postprocess`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InvalidInput

# Open Inference Protocol datatypes -> numpy dtypes (BYTES is an object array of str/bytes).
DTYPES: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}
NP_TO_DATATYPE = {np.dtype(v).str: k for k, v in DTYPES.items() if k != "BYTES"}


def datatype_of(arr: np.ndarray) -> str:
    if arr.dtype == np.object_:
        return "BYTES"
    return NP_TO_DATATYPE[arr.dtype.str]


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    shape: list[int]  # first dimension is the batch dimension, -1 = variable

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(slots=True)
class Prepared:
    """One batching unit."""

    payload: Any
    length: int = 1  # tokens, for bucketing and padding (1 for fixed-shape tensors)
    key: Hashable = None  # items with different keys never share a batch
    cache_key: Hashable = None  # set when the result may be cached


@dataclass
class ModelInfo:
    platform: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    max_length: int = 1
    extra: dict[str, Any] = field(default_factory=dict)


class ServedModel:
    """Base class. Subclasses set ``info`` in :meth:`load`."""

    info: ModelInfo
    device: str = "cpu"

    def load(self) -> None:
        raise NotImplementedError

    def preprocess(self, inputs: dict[str, np.ndarray]) -> list[Prepared]:
        raise NotImplementedError

    def predict(self, payloads: list[Any]) -> Sequence[Any]:
        raise NotImplementedError

    def postprocess(self, results: Sequence[Any]) -> dict[str, np.ndarray]:
        return stack_results(results)

    def warmup_payloads(self, length: int, n: int) -> list[Any]:
        """Synthetic payloads of ``length`` tokens for warm-up batches; [] when not applicable."""
        return []

    def compare(self) -> Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], bool] | None:
        """The model's own rule for "two answers agree" (shadow stage), if it has one."""
        return None

    def close(self) -> None:
        pass


def stack_results(results: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if not results:
        return {}
    out: dict[str, np.ndarray] = {}
    for name in results[0]:
        rows = [r[name] for r in results]
        if isinstance(rows[0], np.ndarray):
            out[name] = np.stack(rows)
        else:
            out[name] = np.array(rows, dtype=object)
    return out


def batch_size_of(inputs: dict[str, np.ndarray], specs: Sequence[TensorSpec]) -> int:
    """Check names and batch dimensions; return the common batch size."""
    names = {s.name for s in specs}
    extra = set(inputs) - names
    if extra:
        raise InvalidInput(f"unexpected input(s) {sorted(extra)}; the model takes {sorted(names)}")
    missing = names - set(inputs)
    if missing:
        raise InvalidInput(f"missing input(s) {sorted(missing)}")
    sizes = set()
    for spec in specs:
        arr = inputs[spec.name]
        if arr.ndim == 0:
            raise InvalidInput(f"input '{spec.name}' must have a batch dimension")
        sizes.add(arr.shape[0])
        if spec.datatype == "BYTES" and len(spec.shape) == 1 and arr.ndim == 2 and arr.shape[1] == 1:
            continue  # [N, 1] strings are accepted as [N]
        if len(spec.shape) != arr.ndim:
            raise InvalidInput(
                f"input '{spec.name}' has shape {list(arr.shape)}, expected {len(spec.shape)} dimensions "
                f"{spec.shape}"
            )
        for got, want in zip(arr.shape[1:], spec.shape[1:], strict=True):
            if want != -1 and got != want:
                raise InvalidInput(f"input '{spec.name}' has shape {list(arr.shape)}, expected {spec.shape}")
    if len(sizes) != 1:
        raise InvalidInput("all inputs must have the same batch size (first dimension)")
    n = sizes.pop()
    if n == 0:
        raise InvalidInput("empty input: the batch dimension is 0")
    return int(n)


def texts_of(arr: np.ndarray, name: str) -> list[str]:
    """A BYTES input of shape [N] or [N, 1] as N strings."""
    if arr.dtype != np.object_:
        raise InvalidInput(f"input '{name}' must be BYTES")
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise InvalidInput(f"input '{name}' must have shape [N] or [N, 1], got {list(arr.shape)}")
    out = []
    for v in arr.tolist():
        if isinstance(v, bytes):
            try:
                v = v.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InvalidInput(f"input '{name}' is not valid UTF-8 text") from e
        elif not isinstance(v, str):
            raise InvalidInput(f"input '{name}' must hold strings")
        out.append(v)
    return out
