"""Custom Python handler classes.

Chosen by ``--handler 'path/to/file.py:ClassName'`` / ``'package.module:ClassName'``, or by a ``handler.py``
with a class ``Handler`` in the model directory. The class (instantiated without arguments) provides::

    inputs  = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]     # metadata, batch dim first
    outputs = [{"name": "score", "datatype": "FP32", "shape": [-1]}]
    max_length = 512                                                    # optional, for length bucketing

    def load(self, model_dir: str, device: str) -> None: ...
    def preprocess(self, inputs: dict[str, numpy.ndarray]) -> list:     # one entry per batch row; an
        ...                                                             # entry may be (payload, length)
    def predict(self, payloads: list) -> list:                          # batched, on the inference thread
        ...
    def postprocess(self, outputs: list) -> dict[str, numpy.ndarray]:   # one request's per-row outputs
        ...
    def compare(self, a: dict, b: dict) -> bool: ...                    # optional: do two answers agree?
                                                                        # (shadow stage; wins over the
                                                                        # ModelDeployment's compare method)

``preprocess``/``postprocess`` run on the event loop (keep them cheap); ``predict`` runs on the inference
thread. ``preprocess`` may raise ``ValueError`` for bad input (answered with 400). The handler is code
supplied by whoever deploys the model: it is trusted like the server itself.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InvalidInput, ModelLoadError
from .base import ModelInfo, Prepared, ServedModel, TensorSpec, batch_size_of, stack_results


def load_handler_class(spec: str, base_dir: Path | None = None) -> type:
    if ":" not in spec:
        raise ModelLoadError(f"handler must be 'module:Class' or 'file.py:Class', got {spec!r}")
    where, cls_name = spec.rsplit(":", 1)
    try:
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_absolute() and base_dir is not None and (base_dir / path).is_file():
                path = base_dir / path
            mod_name = f"modelserver_handler_{abs(hash(str(path.resolve())))}"
            mspec = importlib.util.spec_from_file_location(mod_name, path)
            if mspec is None or mspec.loader is None:
                raise ModelLoadError(f"cannot import handler file {path}")
            module = importlib.util.module_from_spec(mspec)
            sys.modules[mod_name] = module
            mspec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
        cls = getattr(module, cls_name)
    except ModelLoadError:
        raise
    except Exception as e:
        raise ModelLoadError(f"cannot load handler {spec!r}: {type(e).__name__}: {e}") from e
    if not isinstance(cls, type):
        raise ModelLoadError(f"handler {spec!r} is not a class")
    return cls


class CustomModel(ServedModel):
    def __init__(self, handler_spec: str, model_dir: Path | None, device: str = "cpu") -> None:
        self.handler_spec = handler_spec
        self.model_dir = model_dir
        self.device = device

    def load(self) -> None:
        cls = load_handler_class(self.handler_spec, self.model_dir)
        h = cls()
        for name in ("load", "preprocess", "predict"):
            if not callable(getattr(h, name, None)):
                raise ModelLoadError(f"handler {self.handler_spec} has no method {name}()")
        try:
            h.load(str(self.model_dir) if self.model_dir else "", self.device)
            ins = [TensorSpec(d["name"], d["datatype"], list(d["shape"])) for d in h.inputs]
            outs = [TensorSpec(d["name"], d["datatype"], list(d["shape"])) for d in h.outputs]
        except ModelLoadError:
            raise
        except Exception as e:
            raise ModelLoadError(
                f"handler {self.handler_spec} failed to load: {type(e).__name__}: {e}"
            ) from e
        self.handler = h
        self.info = ModelInfo(
            platform="python_handler",
            inputs=ins,
            outputs=outs,
            max_length=int(getattr(h, "max_length", 1) or 1),
        )

    def preprocess(self, inputs: dict[str, np.ndarray]) -> list[Prepared]:
        batch_size_of(inputs, self.info.inputs)
        try:
            rows = self.handler.preprocess(inputs)
        except (ValueError, TypeError, KeyError) as e:
            raise InvalidInput(str(e) or type(e).__name__) from e
        out = []
        for r in rows:
            if isinstance(r, tuple) and len(r) == 2 and isinstance(r[1], int):
                out.append(Prepared(payload=r[0], length=max(1, min(r[1], self.info.max_length))))
            else:
                out.append(Prepared(payload=r, length=1))
        return out

    def predict(self, payloads: list[Any]) -> Sequence[Any]:
        return list(self.handler.predict(payloads))

    def postprocess(self, results: Sequence[Any]) -> dict[str, np.ndarray]:
        post = getattr(self.handler, "postprocess", None)
        if post is None:
            return stack_results(results)
        out = post(list(results))
        return {k: np.asarray(v) if not isinstance(v, np.ndarray) else v for k, v in out.items()}

    def compare(self) -> Any:
        fn = getattr(self.handler, "compare", None)
        return fn if callable(fn) else None

    def warmup_payloads(self, length: int, n: int) -> list[Any]:
        fn = getattr(self.handler, "warmup_payloads", None)
        return list(fn(length, n)) if callable(fn) else []
