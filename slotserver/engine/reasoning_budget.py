"""The reasoning budget: at most N tokens inside a `<think>` block, then its end is forced.

llama.cpp's budget sampler (common/reasoning-budget.cpp), one per sequence, fed every generated
token (postprocess `_accept`); while it forces, the step's sampler may pick only `forced_token`
(step_sampling.py: every other logit -inf, before the chain, as llama.cpp applies it first).

States: IDLE -> COUNTING -> WAITING_UTF8 -> FORCING -> DONE
- IDLE: every token passes; a start sequence (any of `start`) begins COUNTING with `budget`
  tokens left (0: FORCING at once).
- COUNTING: an end sequence (the model closed the block itself) -> DONE; else each token uses
  one of the budget, and at 0 -> FORCING, or WAITING_UTF8 when the token's bytes end inside a
  UTF-8 character (the forced text must not cut one in half).
- WAITING_UTF8: an end sequence -> DONE; a token whose bytes end a character -> FORCING.
- FORCING: `forced` (the budget message's tokens, then the first end tag's) one token per step;
  after the last -> DONE.
- DONE: every token passes; a new start sequence re-arms the budget (some models write several
  blocks, each gets a fresh budget).

Sequences are matched on token ids, not text, as llama.cpp does: the longest sequence ending at
the latest token wins, and matching starts afresh after each match.

One deliberate difference: a prompt that already opened the block (`BudgetSpec.opened`, e.g. a
generation prompt ending in `<think>\\n`) starts COUNTING with the whole budget. llama.cpp feeds
the generation prompt's tokens through the sampler instead, so the tokens after the start tag
(that `\\n`) use up budget, and with budget 0 they advance the forced sequence (a one-token end
tag is then never forced). No torch here: the sequence module carries this and stays torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from slotserver.errors import RequestError

IDLE, COUNTING, WAITING_UTF8, FORCING, DONE = "idle", "counting", "waiting_utf8", "forcing", "done"


@dataclass(frozen=True)
class BudgetSpec:
    """A request's budget settings, as token ids (the server tokenizes the tags and message)."""

    budget: int                            # tokens allowed inside the block, >= 0
    start: tuple[tuple[int, ...], ...]     # any of these opens the block
    end: tuple[tuple[int, ...], ...]       # any of these closes it (the model's own end)
    forced: tuple[int, ...]                # forced when the budget runs out: message + first end tag
    opened: bool = False                   # the prompt already opened the block: start COUNTING

    def __post_init__(self) -> None:
        if not isinstance(self.budget, int) or self.budget < 0:
            raise RequestError(f"reasoning budget must be an integer >= 0, got {self.budget!r}")
        if not any(self.start) or not any(self.end):
            raise RequestError("a reasoning budget needs a non-empty start and end token sequence")

    def check(self, vocab: int) -> None:
        """Every token id in [0, vocab), else RequestError."""
        ids = [t for seq in (*self.start, *self.end, self.forced) for t in seq]
        if any(not 0 <= t < vocab for t in ids):
            raise RequestError(f"reasoning budget token ids must be in [0, {vocab})")


class _Matcher:
    """llama.cpp's token_matcher: which of `seqs` (the longest) ends at the latest token; after a
    match, matching starts afresh (the matched tokens start no further match)."""

    def __init__(self, seqs: Sequence[tuple[int, ...]]) -> None:
        self.seqs = tuple(dict.fromkeys(s for s in seqs if s))   # non-empty, unique, in order
        self._width = max((len(s) for s in self.seqs), default=0)
        self._recent: list[int] = []

    def advance(self, token: int) -> int:
        """-> index in `seqs` of the longest sequence ending here, or -1."""
        self._recent.append(token)
        del self._recent[:-self._width]
        best = -1
        for i, seq in enumerate(self.seqs):
            if tuple(self._recent[-len(seq):]) == seq and (best < 0 or len(seq) > len(self.seqs[best])):
                best = i
        if best >= 0:
            self._recent.clear()
        return best

    def reset(self) -> None:
        self._recent.clear()


def utf8_complete(piece: bytes) -> bool:
    """Whether `piece` ends on a whole UTF-8 character (llama.cpp's common_utf8_is_complete): the
    last lead byte among the final four has all its continuation bytes. Empty is complete."""
    if not piece:
        return True
    for i in range(1, min(4, len(piece)) + 1):
        c = piece[-i]
        if c & 0xC0 != 0x80:
            return i >= (4 if c >= 0xF0 else 3 if c >= 0xE0 else 2 if c >= 0xC0 else 1)
    return False


class ReasoningBudget:
    """One sequence's budget state. `piece(token)` gives a token's bytes (the tokenizer's
    `token_bytes`, special tokens as empty) for the UTF-8 rule; None treats every token as whole."""

    def __init__(self, spec: BudgetSpec, piece: Callable[[int], bytes] | None = None) -> None:
        self.spec, self._piece = spec, piece
        self._start, self._end = _Matcher(spec.start), _Matcher(spec.end)
        self.remaining = spec.budget
        self.force_pos = 0
        self.state = IDLE
        if spec.opened:
            self.state = COUNTING if spec.budget > 0 else FORCING

    @property
    def done(self) -> bool:
        """Not active: nothing is counted or forced (IDLE, or DONE: the block was closed, by the
        model or forced). Speculative drafting asks this: an active budget must see each token
        before the next is sampled. A start tag re-arms it, so a draft may still open a block:
        the verifier feeds accepted tokens one at a time and stops drafting once it is active."""
        return self.state in (IDLE, DONE)

    @property
    def forced_token(self) -> int | None:
        """The only token the next step may sample, or None (every token passes)."""
        if self.state == FORCING and self.force_pos < len(self.spec.forced):
            return self.spec.forced[self.force_pos]
        return None

    def accept(self, token: int) -> None:
        """Advance on one generated token (every one, forced ones included)."""
        if self.state in (IDLE, DONE):
            self._watch_start(token)
        elif self.state in (COUNTING, WAITING_UTF8):
            self._count(token)
        elif self.state == FORCING:
            self._end.advance(token)   # llama.cpp tracks the end tag inside the forced tokens too
            self.force_pos += 1
            if self.force_pos >= len(self.spec.forced):
                self.state = DONE

    def _watch_start(self, token: int) -> None:
        if self._start.advance(token) < 0:
            return
        self.remaining = self.spec.budget
        self._end.reset()
        if self.remaining <= 0:
            self._begin_forcing()
        else:
            self.state = COUNTING

    def _count(self, token: int) -> None:
        if self._end.advance(token) >= 0:
            self.state = DONE        # the model ended the block within its budget
            return
        whole = self._piece is None or utf8_complete(self._piece(token))
        if self.state == WAITING_UTF8:
            if whole:
                self._begin_forcing()
            return
        self.remaining -= 1
        if self.remaining <= 0:
            if whole:
                self._begin_forcing()
            else:
                self.state = WAITING_UTF8
                self._end.reset()

    def _begin_forcing(self) -> None:
        self.state, self.force_pos = FORCING, 0
        self._end.reset()
