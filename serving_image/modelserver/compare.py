"""Do two models' answers to the same request agree? (pure; used by the shadow mirror).

A request's outputs agree when every output agrees; its similarity is the lowest of its outputs'.
Methods (``spec.rollout.shadow.compare.method`` of a ModelDeployment):

* ``cosine``: float tensors, per row (the first axis): every row's cosine similarity >= ``min_cosine``;
  the similarity is the lowest row's. Two zero rows are equal (1.0); one zero row is not (0.0).
* ``argmax``: float tensors of scores, per row: the same top-1 index (similarity 1 or 0).
* ``allclose``: ``numpy.allclose(a, b, rtol, atol)`` elementwise (similarity 1 or 0).
* ``exact``: equal shape and equal values (bytes, integers, booleans; similarity 1 or 0).
* ``auto``: per output, by its type: integer, boolean or bytes -> exact; a classification model's float
  scores -> argmax; other float tensors of rank >= 2 -> cosine per row; float rank 0/1 -> allclose.

Anything that cannot be compared -- a missing output, a shape or type mismatch, a NaN or infinity on
either side -- disagrees (similarity 0). Nothing here raises on the models' outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

#: ``tokenAgreement`` compares generated answers (modelserver.gen_shadow); on tensors it is ``exact``
Method = Literal["auto", "cosine", "argmax", "allclose", "exact", "tokenAgreement"]
METHODS: tuple[Method, ...] = ("auto", "cosine", "argmax", "allclose", "exact", "tokenAgreement")

Outputs = Mapping[str, np.ndarray]
#: a custom handler's ``compare(a, b) -> bool``: the stable's outputs, the shadow's outputs
CustomCompare = Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], bool]


@dataclass(frozen=True)
class CompareSpec:
    method: Method = "auto"
    min_cosine: float = 0.99
    rtol: float = 1.0e-3
    atol: float = 1.0e-5
    min_token_agreement: float = 0.9  # tokenAgreement: matching share of the shorter answer's tokens

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"compare method must be one of {list(METHODS)}, not {self.method!r}")


@dataclass(frozen=True)
class Agreement:
    agree: bool
    similarity: float  # cosine (lowest row), or 1.0 / 0.0
    reason: str = ""  # why they disagree (for logs)


def _is_float(arr: np.ndarray) -> bool:
    return arr.dtype.kind in "fc"


def _is_numeric(arr: np.ndarray) -> bool:
    return arr.dtype.kind in "biufc"


def _rows(arr: np.ndarray) -> np.ndarray:
    return arr.reshape(arr.shape[0], -1) if arr.ndim >= 2 else arr.reshape(1, -1)


def cosine(a: np.ndarray, b: np.ndarray, min_cosine: float) -> Agreement:
    ra = _rows(a).astype(np.float64)
    rb = _rows(b).astype(np.float64)
    dots = np.einsum("ij,ij->i", ra, rb)
    na = np.linalg.norm(ra, axis=1)
    nb = np.linalg.norm(rb, axis=1)
    both_zero = (na == 0) & (nb == 0)
    denom = na * nb
    with np.errstate(invalid="ignore", divide="ignore"):
        sims = np.where(denom > 0, dots / np.where(denom > 0, denom, 1.0), 0.0)
    sims = np.where(both_zero, 1.0, np.clip(sims, -1.0, 1.0))
    low = float(sims.min()) if sims.size else 1.0
    if low >= min_cosine:
        return Agreement(True, low)
    return Agreement(False, low, f"cosine {low:.4f} < {min_cosine}")


def argmax(a: np.ndarray, b: np.ndarray) -> Agreement:
    ra, rb = _rows(a), _rows(b)
    if ra.shape[1] == 0:
        return Agreement(True, 1.0)
    same = np.argmax(ra, axis=1) == np.argmax(rb, axis=1)
    if bool(same.all()):
        return Agreement(True, 1.0)
    return Agreement(False, 0.0, f"top-1 differs in {int((~same).sum())}/{len(same)} rows")


def allclose(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> Agreement:
    if np.allclose(a, b, rtol=rtol, atol=atol):
        return Agreement(True, 1.0)
    worst = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
    return Agreement(False, 0.0, f"not allclose (max |a-b| {worst:.3g}, rtol {rtol}, atol {atol})")


def exact(a: np.ndarray, b: np.ndarray) -> Agreement:
    if a.dtype.kind == "O" or b.dtype.kind == "O":
        same = [_as_bytes(x) == _as_bytes(y) for x, y in zip(a.reshape(-1), b.reshape(-1), strict=True)]
        ok = all(same)
    else:
        ok = bool(np.array_equal(a, b))
    return Agreement(True, 1.0) if ok else Agreement(False, 0.0, "values differ")


def _as_bytes(v: object) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, np.bytes_):
        return bytes(v)
    return str(v).encode("utf-8")


def method_for(arr: np.ndarray, method: Method, classification: bool) -> Method:
    """The method ``auto`` stands for on this output."""
    if method == "tokenAgreement":
        return "exact"
    if method != "auto":
        return method
    if not _is_float(arr):
        return "exact"
    if classification:
        return "argmax"
    return "cosine" if arr.ndim >= 2 else "allclose"


def compare_tensor(
    a: np.ndarray, b: np.ndarray, spec: CompareSpec, classification: bool = False
) -> Agreement:
    """One output of the stable (``a``) and of the shadow (``b``)."""
    try:
        if a.shape != b.shape:
            return Agreement(False, 0.0, f"shape {list(a.shape)} != {list(b.shape)}")
        if _is_numeric(a) != _is_numeric(b):
            return Agreement(False, 0.0, f"type {a.dtype} != {b.dtype}")
        method = method_for(a, spec.method, classification)
        if method != "exact":
            if not (_is_numeric(a) and _is_numeric(b)):
                return Agreement(False, 0.0, f"{method} needs numbers, got {a.dtype}")
            if not (np.isfinite(a).all() and np.isfinite(b).all()):
                return Agreement(False, 0.0, "NaN or infinity in an output")
        if method == "cosine":
            return cosine(a, b, spec.min_cosine)
        if method == "argmax":
            return argmax(a, b)
        if method == "allclose":
            return allclose(a, b, spec.rtol, spec.atol)
        return exact(a, b)
    except Exception as e:  # a comparison never takes the server down
        return Agreement(False, 0.0, f"cannot compare: {type(e).__name__}: {e}")


def compare_outputs(
    stable: Outputs,
    shadow: Outputs,
    spec: CompareSpec,
    *,
    classification: bool = False,
    custom: CustomCompare | None = None,
) -> Agreement:
    """All outputs of one request; a custom handler's ``compare`` wins when the model defines one."""
    if custom is not None:
        try:
            ok = bool(custom(dict(stable), dict(shadow)))
        except Exception as e:
            return Agreement(False, 0.0, f"custom compare raised {type(e).__name__}: {e}")
        return Agreement(ok, 1.0 if ok else 0.0, "" if ok else "custom compare: differ")
    missing = sorted(set(stable) ^ set(shadow))
    if missing:
        return Agreement(False, 0.0, f"outputs differ: {missing}")
    worst = Agreement(True, 1.0)
    for name in sorted(stable):
        got = compare_tensor(np.asarray(stable[name]), np.asarray(shadow[name]), spec, classification)
        if not got.agree:
            return Agreement(False, got.similarity, f"{name}: {got.reason}")
        if got.similarity < worst.similarity:
            worst = got
    return worst
