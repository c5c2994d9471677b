"""The sample part of an engine step: one batched sampler call for the rows a step samples, and
the fallback that finds a failing row.

Why apart from the engine: a step's sampling is one idea (batch the rows, turn the sampler's
tensors into one `Sampled` per row, and when the batch fails, retry row by row so that only the
request whose row failed gets an error, named for its cause), and the engine step should read as
schedule, moves, forward, sample, postprocess.
"""

from __future__ import annotations

import torch

from slotserver.engine.postprocess import Sampled
from slotserver.engine.scheduler import StepPlan
from slotserver.model.sampling.greedy import greedy_tokens_device
from slotserver.model.sampling.sampler import Sampler, SamplingError
from slotserver.model.tensor_check import logits_problem


class StepSampling:
    def __init__(self, vocab_size: int) -> None:
        self.sampler = Sampler(vocab_size)

    def sample(self, plan: StepPlan, logits: torch.Tensor | None, allowed: torch.Tensor | None) -> list[Sampled]:
        """logits: [rows sampled, vocab], in the order of the plan's sampling chunks; allowed: the
        grammar masks of those rows (or None). -> one `Sampled` per sampled row."""
        seqs = [c.seq for c in plan.chunks if c.sample]
        if not seqs:
            return []
        forced = [s.reasoning.forced_token if s.reasoning is not None else None for s in seqs]
        if logits is not None and not logits.is_cpu:   # the GPU's logits: greedy there, else one copy
            tokens = self._on_device(logits, seqs, allowed)
            if tokens is not None:   # a forced token replaces the row's argmax (it is what the mask leaves)
                return [Sampled(t if f is None else f) for t, f in zip(tokens.tolist(), forced)]
            logits = logits.cpu()
        allowed = _force(allowed, forced, self.sampler.vocab_size)
        try:
            out = self.sampler.sample(logits, [s.params for s in seqs], [s.rng for s in seqs],
                                      [s.tokens for s in seqs], allowed)
        except SamplingError:
            return self._rows(seqs, logits, allowed)  # find the failing row; fail only its request
        return _sampled(out, seqs)

    def _on_device(self, logits: torch.Tensor, seqs, allowed: torch.Tensor | None) -> torch.Tensor | None:
        """Every row greedy without grammar, penalties or probabilities: its tokens, argmax on the
        device (only the ids come back); else None, and the host samplers run on a copy. Why not
        every sampler there yet: docs/gpu.md ("Sampling")."""
        if allowed is not None:
            return None
        try:
            return greedy_tokens_device(logits, [s.params for s in seqs])
        except SamplingError:
            return None   # the host path names the failing row and fails only its request

    def _rows(self, seqs, logits: torch.Tensor, allowed: torch.Tensor | None) -> list[Sampled]:
        out = []
        for i, s in enumerate(seqs):
            try:
                row = self.sampler.sample(logits[i: i + 1], [s.params], [s.rng], [s.tokens],
                                          None if allowed is None else allowed[i: i + 1])
                out.extend(_sampled(row, [s]))
            except SamplingError as e:   # NaN logits are the model's fault: say so, not "sampling failed"
                out.append(Sampled(-1, error=logits_problem(logits[i]) or f"sampling failed: {e}"))
        return out


def _force(allowed: torch.Tensor | None, forced: list[int | None], vocab: int) -> torch.Tensor | None:
    """Rows whose reasoning budget is forcing may sample only their forced token: a mask like a
    grammar's, so every other logit is -inf before the chain, as llama.cpp's budget sampler sets
    them. Reported probabilities follow: by default the model's raw ones (the forced token's own
    logprob, the raw top n), with post_sampling_probs the masked chain's (the forced token, p=1).
    A grammar that forbids the forced token leaves the row nothing: it fails, as in llama.cpp."""
    rows = [i for i, f in enumerate(forced) if f is not None]
    if not rows:
        return allowed
    mask = torch.ones(len(forced), vocab, dtype=torch.bool) if allowed is None else allowed.clone()
    idx, tokens = torch.tensor(rows), torch.tensor([forced[i] for i in rows])
    keep = mask[idx, tokens]
    mask[idx] = False
    mask[idx, tokens] = keep
    return mask


def _sampled(out, seqs) -> list[Sampled]:
    """Sampler output -> one `Sampled` per row (top list without the -inf padding columns)."""
    tokens = out.tokens.tolist()
    lps = out.logprobs.tolist() if out.logprobs is not None else [None] * len(seqs)
    result = []
    for i, s in enumerate(seqs):
        n = s.params.n_probs
        top = ()
        if n and out.top_ids is not None:
            top = tuple((t, lp) for t, lp in zip(out.top_ids[i, :n].tolist(), out.top_logprobs[i, :n].tolist())
                        if lp != float("-inf"))
        result.append(Sampled(tokens[i], lps[i], top))
    return result
