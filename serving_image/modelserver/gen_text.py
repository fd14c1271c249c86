"""The text of a generated answer, step by step: token ids in, text to send out (pure: no I/O, no model).

:class:`TextAssembler` is fed each step's new tokens and returns the text that may be sent now. Three
stages, each holding back only text that later tokens could still change:

1. **Tokens to raw text** (:class:`_Detokenizer`), incrementally as vLLM's ``detokenize_incrementally`` and
   HF's ``TextStreamer`` do: each step decodes a window of recent tokens (the previous step's and this
   one's) and passes on what the window's text has beyond what was passed before. A window starts at a
   token so that decoder quirks at a sequence's start (a SentencePiece word's leading space dropped, a
   WordPiece ``##`` kept) fall on text already passed on. Whole characters only: a byte-level BPE token can
   end inside a UTF-8 sequence, so trailing U+FFFD waits for the next token (or the last step). Decoded
   with ``clean_up_tokenization_spaces=False``: that clean-up rewrites text across token boundaries
   (``"don ' t"`` becomes ``"don't"``), so it is applied by stage 2, not per window.
2. **Clean-up** (:class:`_CleanupStream`), when the tokenizer's ``decode`` applies transformers'
   ``clean_up_tokenization``: run on the raw text in pieces cut only where no continuation can create a
   match across the cut, so the pieces' clean-ups join to the clean-up of the whole.
3. **Stop strings** (:class:`_StopScan`): one Knuth-Morris-Pratt matcher per stop, fed only the new
   characters; the text held back is the longest suffix that is a prefix of some stop (the largest matcher
   state); the answer is cut before the stop that is complete first (the stop itself is not sent).

Invariant (what the tests check): for tokens ``ids`` fed in any steps, the concatenation of what ``feed``
returned equals ``cut(tokenizer.decode(ids, skip_special_tokens=...))``, where ``cut`` cuts the text before
the stop occurrence that ends first (of those ending at the same character, the longest). That holds for
tokenizers whose decoder decodes a token the same wherever a window starting at an earlier whole
character places it, except at the window's first token: byte-level BPE, WordPiece, SentencePiece /
Metaspace. Outside it: a SentencePiece byte-fallback run that is not valid UTF-8 (a later invalid byte
turns bytes already sent, valid alone, into U+FFFD in a whole decode; here they stay as sent), and a
tokenizer that overrides ``clean_up_tokenization`` (stage 2 then cuts where the standard clean-up could not
match across a cut: best effort).

Work per step is proportional to the step's new text and the tokens of the last two steps, plus each stop's
length once (its KMP table is built as far as the text ever matches it). Measured on the development
machine, 2,000 tokens fed one at a time with four stops of 20,000 characters (localcluster.genmodel's
byte-level BPE): 0.06 s; decoding all tokens and checking every suffix against every stop at each step, as
before, took 27.8 s. Not bounded: a run of steps that each end inside a UTF-8 sequence (the window grows
until one ends on a whole character: output that is not valid UTF-8, or tokens that each straddle two
characters), and text made only of spaces, apostrophes and the letters n, v, r (stage 2 holds it until a
safe cut).
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

REPLACEMENT = "\ufffd"  # what a decoder writes for bytes that are not (yet) a whole UTF-8 character

# transformers' PreTrainedTokenizerBase.clean_up_tokenization, one str.replace per step, in its order; with
# each pattern's proper prefixes: a text ending in one may become a match once more text follows
CLEANUP_STEPS: tuple[tuple[str, str, tuple[str, ...]], ...] = tuple(
    (pattern, repl, tuple(pattern[:k] for k in range(1, len(pattern))))
    for pattern, repl in (
        (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
        (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
    )
)  # fmt: skip
# The last characters of those prefixes. A text ending in any other character is never changed by what
# follows: the steps only delete spaces, so every step's text still ends in that character, which ends no
# prefix.
_OPEN_ENDS = "".join(sorted({p[-1] for _, _, prefixes in CLEANUP_STEPS for p in prefixes}))
# text whose raw decode holds every clean-up pattern: tells whether (and which) clean-up decode applies
_PROBE = "a ' b . c , d ? e ! f n't g 'm h 's i 've j 're k"


def standard_cleanup(text: str) -> str:
    """transformers' ``clean_up_tokenization`` (the base class's)."""
    for pattern, repl, _ in CLEANUP_STEPS:
        text = text.replace(pattern, repl)
    return text


@dataclass(frozen=True)
class _Profile:
    """What a tokenizer's ``decode`` does beyond its decoder, found once per tokenizer."""

    # special tokens decode drops: kept out of the windows, as a window must not start at one (decoders
    # treat a window's first token as the sequence's first)
    skipped: frozenset[int]
    cleanup: Callable[[str], str] | None  # the clean-up decode applies, if any
    standard: bool  # that clean-up is transformers' standard one (stage 2 then cuts exactly)


_PROFILES: weakref.WeakKeyDictionary[Any, dict[bool, _Profile]] = weakref.WeakKeyDictionary()


def _profile(tokenizer: Any, skip: bool) -> _Profile:
    try:
        per = _PROFILES.setdefault(tokenizer, {})
    except TypeError:  # not weakly referable or not hashable: found again per answer
        per = {}
    if skip not in per:
        per[skip] = _Profile(_skipped(tokenizer, skip), *_cleanup_of(tokenizer, skip))
    return per[skip]


def _skipped(tokenizer: Any, skip: bool) -> frozenset[int]:
    if not skip:
        return frozenset()
    ids = set(getattr(tokenizer, "all_special_ids", None) or ())
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(i for i, t in added.items() if getattr(t, "special", False))
    return frozenset(
        i
        for i in ids
        if tokenizer.decode([i], skip_special_tokens=True, clean_up_tokenization_spaces=False) == ""
    )


def _cleanup_of(tokenizer: Any, skip: bool) -> tuple[Callable[[str], str] | None, bool]:
    """Compares decode with and without clean-up on a probe: which of them a tokenizer applies depends on
    its settings and on the transformers version (5.x skips it for BPE models unless told otherwise)."""
    fn: Callable[[str], str] = getattr(tokenizer, "clean_up_tokenization", standard_cleanup)
    std = fn(_PROBE) == standard_cleanup(_PROBE)
    try:
        ids = list(tokenizer.encode(_PROBE, add_special_tokens=False))
        raw = tokenizer.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
        cooked = tokenizer.decode(ids, skip_special_tokens=skip)
    except (AttributeError, TypeError):  # no probe possible: the setting decides
        raw = cooked = ""
    if raw == cooked and (
        standard_cleanup(raw) != raw or not getattr(tokenizer, "clean_up_tokenization_spaces", False)
    ):
        return None, False
    return (standard_cleanup if std else fn), std


class _Detokenizer:
    """Token ids to raw text, a window at a time (stage 1 of the module docstring)."""

    def __init__(self, decode: Callable[[list[int]], str], skipped: frozenset[int]) -> None:
        self.decode, self.skipped = decode, skipped
        self.ids: list[int] = []
        self.start = 0  # the window's first token
        self.mark = 0  # where the last step that ended on a whole character ended: the next window's start
        self.done = 0  # characters of decode(ids[start:]) already passed on

    def push(self, new: Sequence[int], final: bool) -> str:
        if self.skipped:
            self.ids.extend(t for t in new if t not in self.skipped)
        else:
            self.ids.extend(new)
        n = len(self.ids)
        text = self.decode(self.ids[self.start : n]) if n > self.start else ""
        whole = len(text) if final else len(text.rstrip(REPLACEMENT))
        piece = text[self.done : whole]
        if whole < len(text):  # the window grows until a step ends on a whole character
            self.done = max(self.done, whole)
        elif n > self.mark > self.start:
            # all passed on: the next window starts at the first token of the steps since the last slide,
            # whose text is passed on already (a step that added no token does not slide: the window would
            # start at a token not passed on, and its start quirk, a dropped space, would reach the answer)
            self.start, self.done, self.mark = self.mark, len(self.decode(self.ids[self.mark : n])), n
        else:
            self.done, self.mark = whole, n
        return piece


class _CleanupStream:
    """Clean-up of raw text that arrives in pieces (stage 2 of the module docstring)."""

    def __init__(self, fn: Callable[[str], str], standard: bool) -> None:
        self.fn, self.standard = fn, standard
        self.pending = ""  # raw text that a continuation could still change

    def push(self, text: str, final: bool) -> str:
        pending = self.pending + text
        k = len(pending) if final else self._settled(pending)
        self.pending = pending[k:]
        return self.fn(pending[:k]) if k else ""

    def _settled(self, text: str) -> int:
        """The longest prefix of ``text`` that no continuation changes the clean-up of: all of it when no
        step's text ends in a prefix of that step's pattern (then no step can match across the end, so
        the steps act on it and on what follows separately), else up to its last character outside
        :data:`_OPEN_ENDS`."""
        if self.standard:
            s = text
            for pattern, repl, prefixes in CLEANUP_STEPS:
                if s.endswith(prefixes):
                    break
                s = s.replace(pattern, repl)
            else:
                return len(text)
        return len(text.rstrip(_OPEN_ENDS))


class _Stop:
    """One stop string's Knuth-Morris-Pratt matcher. ``state``: the length of the longest suffix of the text
    so far that is a prefix of the stop. The failure table is built only as far as states reach."""

    __slots__ = ("fail", "state", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.fail = [0]  # fail[i]: the longest proper border of text[: i + 1]
        self.state = 0

    def _grow(self, n: int) -> None:
        s, fail = self.text, self.fail
        q = fail[-1]
        for i in range(len(fail), n):
            while q and s[i] != s[q]:
                q = fail[q - 1]
            if s[i] == s[q]:
                q += 1
            fail.append(q)

    def scan(self, text: str, last: int) -> tuple[int, int]:
        """Feeds ``text[: last + 1]``: (the index where the stop completes, or -1; characters stepped)."""
        s, m, first = self.text, len(self.text), self.text[0]
        q, k, steps = self.state, 0, 0
        while k <= last:
            if q == 0:  # nothing can match before the stop's first character: find it at C speed
                k = text.find(first, k, last + 1)
                if k < 0:
                    break
            c = text[k]
            steps += 1
            while q and s[q] != c:
                q = self.fail[q - 1]
                steps += 1
            if s[q] == c:
                q += 1
                if q == m:
                    self.state = q
                    return k, steps
                if q > len(self.fail):
                    self._grow(min(m, 2 * q))
            k += 1
        self.state = q
        return -1, steps


class _StopScan:
    """Holds back what may begin a stop, cuts before the first complete one (stage 3 of the module
    docstring)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [_Stop(s) for s in dict.fromkeys(stops) if s]  # an empty stop is refused upstream
        self.held: deque[str] = deque()  # text not yet sent, in the pieces it came in
        self.front = 0  # characters of held[0] already sent
        self.held_len = 0
        self.scanned = 0  # characters the matchers stepped through (the work-bound test reads it)

    def push(self, text: str, final: bool) -> tuple[str, bool]:
        """(text to send now, whether a stop was found)."""
        end, length = -1, 0
        for stop in self.stops:
            e, steps = stop.scan(text, len(text) - 1 if end < 0 else end)
            self.scanned += steps
            if e >= 0 and (end < 0 or (e, -len(stop.text)) < (end, -length)):  # ends first, then longest
                end, length = e, len(stop.text)
        before = self.held_len
        if text:
            self.held.append(text)
            self.held_len += len(text)
        if end >= 0:  # a match ending in text began at most held_len characters before it
            return self._release(before + end + 1 - length), True
        keep = 0 if final else max((s.state for s in self.stops), default=0)
        return self._release(self.held_len - keep), False

    def _release(self, n: int) -> str:
        """The first ``n`` held characters, no longer held."""
        out: list[str] = []
        self.held_len -= n
        while n > 0:
            piece = self.held[0]
            rest = len(piece) - self.front
            if rest <= n:
                out.append(piece[self.front :] if self.front else piece)
                self.held.popleft()
                self.front, n = 0, n - rest
            else:
                out.append(piece[self.front : self.front + n])
                self.front, n = self.front + n, 0
        return "".join(out)


class TextAssembler:
    """A generated answer's text, step by step: ``feed(new_tokens, final=...)`` returns the text to send
    now. ``stopped``: a stop string was found (the answer ends there, further feeds return nothing);
    ``sent``: all text returned so far.

    ``tokenizer``: a transformers tokenizer (anything whose ``decode(ids, skip_special_tokens=...,
    clean_up_tokenization_spaces=...)`` and ``encode(text, add_special_tokens=False)`` behave as its do),
    not a decode function: stage 1 decodes without the clean-up and stage 2 needs to know which clean-up
    ``decode`` applies (the module docstring says why)."""

    def __init__(self, tokenizer: Any, stops: Sequence[str], *, skip_special_tokens: bool = True) -> None:
        prof = _profile(tokenizer, skip_special_tokens)

        def decode(ids: list[int]) -> str:
            text: str = tokenizer.decode(
                ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
            )
            return text

        self._tokens = _Detokenizer(decode, prof.skipped)
        self._cleanup = _CleanupStream(prof.cleanup, prof.standard) if prof.cleanup else None
        self._stops = _StopScan(stops)
        self._sent: list[str] = []
        self.stopped = False
        self.ended = False  # the last step was fed or a stop was found

    def feed(self, new: Sequence[int], final: bool = False) -> str:
        if self.ended:
            return ""
        text = self._tokens.push(new, final)
        if self._cleanup is not None:
            text = self._cleanup.push(text, final)
        out, self.stopped = self._stops.push(text, final)
        self.ended = final or self.stopped
        if out:
            self._sent.append(out)
        return out

    @property
    def sent(self) -> str:
        if len(self._sent) > 1:  # joined once when read, not per step
            self._sent[:] = ["".join(self._sent)]
        return self._sent[0] if self._sent else ""

    @property
    def scanned(self) -> int:
        """Characters the stop matchers stepped through: O(text x stops), for the work-bound test."""
        return self._stops.scanned
