"""The draft part of an engine step: which decoding sequences speculate, how far, and what the
drafters propose; and what the step's verification taught.

After scheduling, every chunk that decodes one token of an eligible sequence may carry a draft:
the target model then computes `1 + len(draft)` rows for it in the same forward, and sampling
verifies them (verify.py). A sequence is eligible when nothing but the target's logits decides its
tokens: no grammar, no reasoning budget still counting, not asked to stop speculating
(`speculative.n_max` 0). A draft never runs past the slot's context (one cell is left, as
llama-server leaves one for a context shift), past `n_predict`, past the step's token budget, or
past the paged pool.

Turning itself down (`SpecConfig.adaptive`): a draft that was wholly accepted doubles the
sequence's cap (up to the type's n_max); one that was partly rejected sets it to twice what was
accepted, plus one; one with nothing accepted also makes the sequence skip drafting for 1, 2, 4 ...
up to 16 steps. So a conversation the drafters cannot guess costs a few short rejected drafts,
not a long one every step (docs/performance.md measures it on plain chat).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from slotserver.engine.scheduler import ScheduledChunk, StepPlan
from slotserver.engine.speculative.config import SpecConfig
from slotserver.engine.speculative.drafter import DraftRequest, Drafter
from slotserver.engine.speculative.ngram_mod import NgramMod
from slotserver.engine.speculative.ngram_simple import NgramSimple

MAX_BACKOFF = 16


@dataclass
class SpecState:
    """A sequence's speculation: its totals (the response's timings) and its adaptive cap."""

    cap: int
    synth_rng: object = None  # --spec-synth-*: the acceptance draws' own stream (a SequenceRng)
    drafted: int = 0          # draft tokens proposed (timings.draft_n)
    accepted: int = 0         # of which the target kept (timings.draft_n_accepted)
    drafts: int = 0           # verifications
    skip: int = 0             # steps left without a draft
    backoff: int = 0
    last: int = -1            # index of the drafter that proposed the pending draft

    def learn(self, n_drafted: int, n_accepted: int, n_max: int, adaptive: bool) -> None:
        self.drafted, self.accepted, self.drafts = self.drafted + n_drafted, self.accepted + n_accepted, self.drafts + 1
        if not adaptive:
            return
        self.cap = min(n_max, self.cap * 2) if n_accepted == n_drafted else max(1, 2 * n_accepted + 1)
        self.backoff = 0 if n_accepted else min(MAX_BACKOFF, max(1, 2 * self.backoff))
        self.skip = self.backoff


def make_drafters(config: SpecConfig, draft_bundle=None, n_slots: int = 0, n_cells: int = 0,
                  kv_dtype=None) -> list[Drafter]:
    out: list[Drafter] = []
    for t in config.types:
        if t == "ngram-simple":
            out.append(NgramSimple(config.ngram_simple_size_n, config.ngram_simple_size_m))
        elif t == "ngram-mod":
            out.append(NgramMod(config.ngram_mod_n_match, config.ngram_mod_n_min, config.ngram_mod_n_max))
        elif t == "draft-simple":
            from slotserver.engine.speculative.draft_model import DraftModel   # torch, a second cache
            out.append(DraftModel(draft_bundle, n_slots, n_cells, config.draft_n_max, config.draft_n_min,
                                  config.draft_p_min, kv_dtype))
    return out


class Speculator:
    def __init__(self, config: SpecConfig, n_cells: int, vocab: int, drafters: list[Drafter]) -> None:
        self.config, self.n_cells, self.vocab, self.drafters = config, n_cells, vocab, drafters
        self.n_max = config.n_max
        self.synthetic = bool(config.synth_probs)                   # --spec-synth-*: acceptance at given rates
        self.adaptive = config.adaptive and not self.synthetic     # ... measured as given, so no adaptive cap
        self._known: set[int] = set()   # sequence ids the drafters may hold state for

    @property
    def enabled(self) -> bool:
        return bool(self.drafters)

    def draft(self, plan: StepPlan, running: set[int], token_room: int, fits=None) -> None:
        """Give the plan's eligible decode chunks a draft (in place). running: ids of the sequences in
        slots; token_room: tokens the step may still take; fits(seq, n_cells) -> whether the paged
        pool holds the sequence at n_cells (None: a flat layout)."""
        self._forget_gone(running)
        wants = [(i, c, self._room(c.seq)) for i, c in enumerate(plan.chunks) if self._wants_draft(c)]
        wants = [(i, c, n) for i, c, n in wants if n > 0]
        if not wants or token_room <= 0:
            return
        drafts: dict[int, tuple[int, list[int]]] = {}
        for d, drafter in enumerate(self.drafters):
            asks = [(i, c, n) for i, c, n in wants if i not in drafts]
            if not asks:
                break
            got = drafter.propose([DraftRequest(c.seq.id, c.seq.slot_id, c.seq.tokens, n, c.seq.request.spec_n_min,
                                                c.seq.request.spec_p_min, c.seq.prompt_end) for _, c, n in asks])
            for (i, c, n), tokens in zip(asks, got):
                tokens = _valid(tokens[:n], self.vocab)
                if tokens:
                    drafts[i] = (d, tokens)
        for i, (d, tokens) in sorted(drafts.items()):
            c = plan.chunks[i]
            tokens = tokens[:token_room]
            if fits is not None and not fits(c.seq, c.seq.num_tokens + len(tokens)):
                continue
            if tokens:
                token_room -= len(tokens)
                c.seq.spec.last = d
                plan.chunks[i] = replace(c, draft=tuple(tokens))

    def _wants_draft(self, c: ScheduledChunk) -> bool:
        """Whether the chunk's sequence drafts this step. Gives a new sequence its `SpecState`, and a
        sequence backing off spends one of its skipped steps here."""
        seq = c.seq
        if c.n != 1 or not c.sample or seq.grammar is not None or seq.request.spec_n_max == 0:
            return False
        if c.start < seq.prompt_end:   # the prompt's last token (a cached prefix): drafts start after the
            return False               # first sampled token, as llama-server's (same draws however cached)
        budget = getattr(seq, "reasoning", None)
        if budget is not None and not budget.done:
            return False
        if seq.spec is None:
            seq.spec = SpecState(cap=self.n_max, synth_rng=self._synth_rng(seq))
            self._known.add(seq.id)
        if seq.spec.skip > 0:
            seq.spec.skip -= 1
            return False
        return True

    def _synth_rng(self, seq):
        """--spec-synth-*: a second random stream, seeded with the request's seed (llama.cpp's spec_synth_rng)."""
        if not self.synthetic:
            return None
        from slotserver.model.sampling.sampler import SequenceRng   # torch: only with synthetic acceptance
        return SequenceRng(seq.rng.seed)

    def _room(self, seq) -> int:
        """How many draft tokens the sequence may take: its cap, the context (one cell spare), n_predict."""
        n = min(seq.spec.cap, self.n_cells - seq.num_tokens - 1)
        if seq.request.spec_n_max is not None:
            n = min(n, seq.request.spec_n_max)
        if seq.request.n_predict >= 0:
            n = min(n, seq.request.n_predict - seq.num_generated - 1)
        return n

    def learn(self, plan: StepPlan, runs) -> None:
        """After sampling: `runs` has one tuple of accepted tokens per sampling chunk (verify.py)."""
        if not self.drafters:
            return
        for c, run in zip((c for c in plan.chunks if c.sample), runs):
            if c.draft:
                n_accepted = len(run) - 1
                c.seq.spec.learn(len(c.draft), n_accepted, self.n_max, self.adaptive)
                self.drafters[c.seq.spec.last].accepted(c.seq.id, len(c.draft), n_accepted)

    def _forget_gone(self, running: set[int]) -> None:
        for gone in [s for s in self._known if s not in running]:
            self._known.discard(gone)
            for d in self.drafters:
                d.forget(gone)


def _valid(tokens: list[int], vocab: int) -> list[int]:
    """Cut a draft at its first id outside the target's vocabulary (a larger draft vocabulary)."""
    for j, t in enumerate(tokens):
        if not 0 <= t < vocab:
            return tokens[:j]
    return list(tokens)
