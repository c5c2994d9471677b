"""Context shift (`--context-shift`), llama-server's `pre_decode`: a generating sequence whose slot is
full drops `n_discard` tokens after its first `n_keep` and goes on generating.

Pure bookkeeping, no torch (the scheduler imports it): `ContextShift.plan(seq, stream)` edits the
sequence's counters and returns a `KVShift`, a plan item the engine applies before the forward
(`Engine._apply_moves` -> engine/kv_shift.py: the KV cells move down and K is re-rotated by the
position delta, exactly, with the model's own RoPE). Cache reuse (engine/cache_reuse.py) makes
the same plan item.

llama-server's rule (tools/server/server-context.cpp, `pre_decode`), followed to the letter:
- when: a generating slot with `n_past + 1 >= n_ctx` (the sampled token would take the last
  cell), i.e. here `num_computed + 1 >= n_cells` once the prompt is done. Postprocess then does not
  end the sequence (engine/postprocess.py), the scheduler shifts it at the next step.
- n_keep: the request's `n_keep`, -1 meaning the whole prompt (its original length), plus one
  when the model adds a BOS token, at most `n_ctx - 4`.
- n_discard: the request's `n_discard`, 0 meaning half of `n_left = n_past - n_keep`; clamped to
  `[0, n_left - 1]`.
- the response says `truncated: true` from then on, whatever ends the request.
What changes for the sequence: `tokens` drops the discarded ones, so it stays what the KV holds
(the slot's prompt cache after the request is right, and the sampler's penalty history is those
tokens); `num_discarded` / `num_prompt_discarded` keep `num_generated` and the prompt's end right,
so n_predict, `tokens_predicted` and `tokens_evaluated` count every token.

Differs from llama-server in one place: llama-server refuses a shift for n > 1 choices ("context
shift cannot be used for shared prompt", its children copy the parent's state); here a sibling's
KV is its own once copied, so it shifts like any sequence.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from slotserver.engine.config import MIN_SHIFT_CELLS
from slotserver.engine.sequence import Sequence

log = logging.getLogger("slotserver.engine.context_shift")


@dataclass(frozen=True)
class Span:
    """`n` cells starting at `src` move to `dst` (dst <= src), keys re-rotated by dst - src."""

    src: int
    dst: int
    n: int


@dataclass(frozen=True)
class KVShift:
    """A plan item: the spans of `stream` move down (in order); afterwards the stream holds its
    first `keep` cells (a paged layout gives the blocks past them back)."""

    stream: int
    spans: tuple[Span, ...]
    keep: int

    @property
    def n_source(self) -> int:
        """Cells the shift reads: up to the end of its last span."""
        return max((s.src + s.n for s in self.spans), default=0)


@dataclass(frozen=True)
class ContextShift:
    """llama-server's context shift for slots of `n_cells`; `add_bos`: the model adds a BOS token
    (llama-server then keeps one token more)."""

    n_cells: int
    add_bos: bool

    def due(self, seq: Sequence) -> bool:
        """A generating sequence whose next token would take the slot's last cell."""
        return bool(seq.t_prompt_done) and seq.num_pending > 0 and seq.num_computed + 1 >= self.n_cells

    def sizes(self, seq: Sequence) -> tuple[int, int]:
        """(n_keep, n_discard) as llama-server computes them for this sequence now."""
        req = seq.request
        n_keep = seq.num_prompt if req.n_keep < 0 else req.n_keep
        n_keep = max(0, min(self.n_cells - MIN_SHIFT_CELLS, n_keep + int(self.add_bos)))
        n_left = seq.num_computed - n_keep
        n_discard = req.n_discard if req.n_discard else int(n_left / 2)   # C's division: toward zero
        return n_keep, min(max(n_discard, 0), max(0, n_left - 1))

    def shift_full(self, running: list[Sequence], stream_of: dict[int, int]) -> list[KVShift]:
        """Shift every running sequence that is due; -> the KV moves (the scheduler's plan items)."""
        shifts = [self.plan(seq, stream_of[seq.slot_id]) for seq in running if self.due(seq)]
        return [s for s in shifts if s is not None]

    def plan(self, seq: Sequence, stream: int) -> KVShift | None:
        """Drop the tokens after n_keep from the sequence's counters; -> the KV move, or None when
        nothing is discarded (n_left too small)."""
        n_keep, n_discard = self.sizes(seq)
        log.info("slot %d: context shift, n_keep = %d, n_left = %d, n_discard = %d", seq.slot_id, n_keep,
                 seq.num_computed - n_keep, n_discard)   # llama-server's warning line
        seq.shifted = True   # llama-server: slot.truncated = true
        if n_discard == 0:
            return None
        end = n_keep + n_discard
        seq.num_prompt_discarded += max(0, min(seq.prompt_end, end) - n_keep)
        seq.num_discarded += n_discard
        n_moved = seq.num_computed - end
        del seq.tokens[n_keep:end]
        seq.num_computed -= n_discard
        return KVShift(stream, (Span(end, n_keep, n_moved),), seq.num_computed)
