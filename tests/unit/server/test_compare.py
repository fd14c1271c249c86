"""Output agreement between a stable and a shadow revision: the comparators on hand-built outputs."""

from __future__ import annotations

import numpy as np
import pytest
from modelserver.compare import CompareSpec, compare_outputs, compare_tensor, method_for

AUTO = CompareSpec()
rng = np.random.default_rng(7)


def emb(rows: int = 4, dim: int = 8) -> np.ndarray:
    return rng.normal(size=(rows, dim)).astype(np.float32)


def test_equal_embeddings_agree_with_similarity_one():
    a = emb()
    got = compare_outputs({"embedding": a}, {"embedding": a.copy()}, AUTO)
    assert got.agree and got.similarity == pytest.approx(1.0, abs=1e-6)


def test_noise_within_min_cosine_agrees_and_beyond_it_disagrees():
    a = emb(dim=384)
    small = a + 0.01 * rng.normal(size=a.shape).astype(np.float32)
    big = a + 0.5 * rng.normal(size=a.shape).astype(np.float32)
    assert compare_outputs({"e": a}, {"e": small}, AUTO).agree
    got = compare_outputs({"e": a}, {"e": big}, AUTO)
    assert not got.agree and got.similarity < 0.99 and "cosine" in got.reason


def test_one_bad_row_is_enough_to_disagree():
    a = emb()
    b = a.copy()
    b[2] = -b[2]
    got = compare_outputs({"e": a}, {"e": b}, AUTO)
    assert not got.agree and got.similarity == pytest.approx(-1.0, abs=1e-6)


def test_permuted_rows_disagree():
    a = emb()
    assert not compare_outputs({"e": a}, {"e": a[[1, 0, 3, 2]]}, AUTO).agree


def test_nan_or_inf_disagrees_never_raises():
    a = emb()
    b = a.copy()
    b[0, 0] = np.nan
    assert not compare_outputs({"e": a}, {"e": b}, AUTO).agree
    assert not compare_outputs({"e": b}, {"e": b}, AUTO).agree  # NaN on both sides is not agreement
    c = a.copy()
    c[1, 1] = np.inf
    assert not compare_outputs({"e": a}, {"e": c}, AUTO).agree


def test_shape_type_and_output_mismatches_disagree():
    a = emb()
    assert "shape" in compare_outputs({"e": a}, {"e": a[:3]}, AUTO).reason
    assert not compare_outputs({"e": a}, {"e": a.reshape(2, 16)}, AUTO).agree
    words = np.array(["a", "b", "c", "d"], dtype=object)
    assert not compare_outputs({"e": a[:, 0]}, {"e": words}, AUTO).agree
    assert "outputs differ" in compare_outputs({"e": a}, {"e": a, "extra": a}, AUTO).reason
    assert not compare_outputs({"e": a}, {}, AUTO).agree


def test_zero_rows():
    z = np.zeros((2, 4), dtype=np.float32)
    assert compare_outputs({"e": z}, {"e": z}, AUTO).agree
    one = z.copy()
    one[0, 0] = 1.0
    assert not compare_outputs({"e": z}, {"e": one}, AUTO).agree


def test_classification_scores_compare_by_top1_label():
    logits = np.array([[2.0, 1.0, 0.1], [0.1, 0.2, 3.0]], dtype=np.float32)
    shifted = logits * 0.5 + 0.3  # other numbers, same ranking
    swapped = logits[:, [1, 0, 2]]  # row 0's top label changes
    assert compare_outputs({"logits": logits}, {"logits": shifted}, AUTO, classification=True).agree
    got = compare_outputs({"logits": logits}, {"logits": swapped}, AUTO, classification=True)
    assert not got.agree and "1/2 rows" in got.reason


def test_exact_for_bytes_ints_and_bools_and_str_equals_bytes():
    labels = np.array(["POSITIVE", "NEGATIVE"], dtype=object)
    as_bytes = np.array([b"POSITIVE", b"NEGATIVE"], dtype=object)
    assert compare_outputs({"label": labels}, {"label": as_bytes}, AUTO).agree
    assert not compare_outputs({"label": labels}, {"label": labels[::-1].copy()}, AUTO).agree
    n = np.array([3, 4], dtype=np.int64)
    assert compare_outputs({"n": n}, {"n": n.copy()}, AUTO).agree
    assert not compare_outputs({"n": n}, {"n": n + 1}, AUTO).agree
    assert not compare_outputs({"b": np.array([True])}, {"b": np.array([False])}, AUTO).agree


def test_allclose_uses_rtol_and_atol():
    spec = CompareSpec(method="allclose", rtol=1e-3, atol=1e-5)
    a = np.array([1.0, 100.0], dtype=np.float64)
    assert compare_tensor(a, a * (1 + 5e-4), spec).agree
    assert not compare_tensor(a, a * (1 + 5e-3), spec).agree
    assert compare_tensor(np.array([0.0]), np.array([5e-6]), spec).agree


def test_auto_picks_by_type_and_rank():
    assert method_for(np.zeros((2, 3), np.float32), "auto", False) == "cosine"
    assert method_for(np.zeros((2, 3), np.float32), "auto", True) == "argmax"
    assert method_for(np.zeros(3, np.float32), "auto", False) == "allclose"
    assert method_for(np.zeros(3, np.int64), "auto", True) == "exact"
    assert method_for(np.zeros(3, object), "auto", False) == "exact"
    assert method_for(np.zeros((2, 3), np.float32), "exact", False) == "exact"


def test_an_explicit_method_applies_to_every_output():
    a = emb()
    spec = CompareSpec(method="exact")
    assert not compare_outputs({"e": a}, {"e": a + 1e-7}, spec).agree
    assert compare_outputs({"e": a}, {"e": a + 1e-7}, CompareSpec(method="cosine")).agree


def test_argmax_on_bytes_disagrees_instead_of_raising():
    words = np.array(["a"], dtype=object)
    got = compare_tensor(words, words.copy(), CompareSpec(method="argmax"))
    assert not got.agree and "needs numbers" in got.reason


def test_a_custom_compare_wins_and_its_exceptions_are_disagreement():
    a, b = {"e": emb()}, {"e": emb()}
    assert compare_outputs(a, b, AUTO, custom=lambda x, y: True).agree
    assert not compare_outputs(a, a, AUTO, custom=lambda x, y: False).agree

    def boom(x, y):
        raise KeyError("nope")

    got = compare_outputs(a, a, AUTO, custom=boom)
    assert not got.agree and "KeyError" in got.reason


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="compare method"):
        CompareSpec(method="fuzzy")  # type: ignore[arg-type]
