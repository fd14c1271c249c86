"""A lower bound on a text's token count, found without tokenizing it.

Every tokenizer the server loads (WordPiece, byte-level BPE, SentencePiece, Unigram) gives at least one
token to each word that holds a letter or a digit, when words are separated by space, tab, CR or LF: a
word is never merged with its neighbour across such a separator, and a letter or a digit is never
dropped (at worst it becomes the unknown token). Other characters are not counted: control and format
characters may be removed by a normalizer, and other Unicode spaces may not separate anything.

So a text with more such words than the maximum sequence length is too long, whatever the tokenizer
makes of it; the server refuses it (413) before tokenizing, at a cost bounded by that maximum.
"""

from __future__ import annotations

import re

_WORD = re.compile(r"[^ \t\r\n]+")
_COUNTED = re.compile(r"[^\W_]")  # a letter or a digit (Unicode)


def exceeds_words(text: str, limit: int) -> bool:
    """True when ``text`` holds more than ``limit`` counted words (so more than ``limit`` tokens).

    Scans at most ``limit + 1`` words: a long text that is too long is found after its first words."""
    seen = 0
    for m in _WORD.finditer(text):
        if _COUNTED.search(text, m.start(), m.end()) is not None:
            seen += 1
            if seen > limit:
                return True
    return False
