"""The sample part of an engine step: one batched sampler call for the rows a step samples, and
the fallback that finds a failing row.

Why apart from the engine: a step's sampling is one idea (batch the rows, turn the sampler's
tensors into one `Sampled` per row, and when the batch fails, retry row by row so that only the
request whose row failed gets an error, named for its cause), and the engine step should read as
schedule, moves, forward, sample, postprocess.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from slotserver.engine.postprocess import Sampled
from slotserver.engine.scheduler import StepPlan
from slotserver.engine.speculative.verify import greedy_run, sampled_run, synth_run
from slotserver.engine.sampled_ids import SampledIds
from slotserver.model.sampling.greedy import greedy_ids_device, greedy_tokens_device
from slotserver.model.sampling.sampler import Sampler, SamplingError
from slotserver.model.tensor_check import logits_problem


class StepSampling:
    def __init__(self, vocab_size: int, synth_probs: tuple[float, ...] = (), eog: frozenset[int] = frozenset()) -> None:
        """synth_probs, eog: --spec-synth-*'s acceptance (speculative/verify.py `synth_run`)."""
        self.sampler = Sampler(vocab_size)
        self.synth_probs, self.eog = synth_probs, eog

    def sample(self, plan: StepPlan, logits: torch.Tensor | None,
               allowed: torch.Tensor | None) -> list[tuple[Sampled, ...]]:
        """logits: [rows, vocab] in plan order, 1 + len(draft) rows for a drafted chunk and 1 for any
        other sampling chunk; allowed: the grammar masks of the sampling chunks (or None).
        -> per sampling chunk, the tokens it gets: one, or a verified draft's run (speculative/verify.py)."""
        chunks = [c for c in plan.chunks if c.sample]
        if not any(c.draft for c in chunks):
            return [(s,) for s in self._sample_rows([c.seq for c in chunks], logits, allowed)]
        starts, row = [], 0
        for c in chunks:
            starts.append(row)
            row += 1 + len(c.draft)
        plain = [i for i, c in enumerate(chunks) if not c.draft]
        out: list[tuple[Sampled, ...]] = [()] * len(chunks)
        if plain:
            rows = logits[torch.tensor([starts[i] for i in plain], device=logits.device)]
            mask = None if allowed is None else allowed[plain]
            for i, s in zip(plain, self._sample_rows([chunks[i].seq for i in plain], rows, mask)):
                out[i] = (s,)
        for i, c in enumerate(chunks):
            if c.draft:
                out[i] = self._verify(c, logits[starts[i]: starts[i] + 1 + len(c.draft)])
        return out

    def sample_ids(self, plan: StepPlan, logits: torch.Tensor) -> SampledIds | None:
        """The overlapped step's hook (engine/overlap.py): one token per chunk, sampled where the
        logits are without waiting for them, or None where these rows need the host (another
        sampler, probabilities, penalties). The caller has checked: no drafts, grammars or forced
        tokens. A device sampler beyond greedy plugs in here (it returns `[2, rows]` as greedy does)."""
        try:
            ids = greedy_ids_device(logits, [c.seq.params for c in plan.chunks if c.sample])
        except SamplingError:
            return None   # a bad logit_bias id: the host path names it and fails only its request
        return None if ids is None else SampledIds(ids)

    def _sample_rows(self, seqs, logits: torch.Tensor | None, allowed: torch.Tensor | None) -> list[Sampled]:
        """One token per row (the step's sampling without drafts)."""
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

    def _verify(self, chunk, rows: torch.Tensor) -> tuple[Sampled, ...]:
        """A drafted chunk's rows [1 + k, vocab] -> the run its sequence keeps (at least one token)."""
        seq = chunk.seq
        try:
            if self.synth_probs:
                outs, tokens = synth_run(self.sampler, rows.cpu(), seq, chunk.draft, self.synth_probs, self.eog)
                return tuple(replace(_sampled(o, [seq])[0], token=t) for o, t in zip(outs, tokens))
            tokens = greedy_run(rows, seq.params, chunk.draft, self.sampler)
            if tokens is not None:
                return tuple(Sampled(t) for t in tokens)
            rows = rows.cpu()
            return tuple(_sampled(o, [seq])[0] for o in sampled_run(self.sampler, rows, seq, chunk.draft))
        except SamplingError:
            return tuple(self._rows([seq], rows[:1].cpu(), None))   # row 0 names the problem

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
