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
from slotserver.model.sampling.device import DeviceSampler
from slotserver.model.sampling.greedy import greedy_ids_device
from slotserver.model.sampling.infill import InfillVocab
from slotserver.model.sampling.sampler import Sampler, SamplingError
from slotserver.model.tensor_check import logits_problem
from slotserver.runtime.device import upload


# Below this many rows a step's non-greedy rows (top-k/p, probabilities, grammars) go to the host
# sampler on a copy of their logits: on an H100 (docs/gpu.md, 2026-11-27) the device sampler's ~30-110
# small launches cost more than copying one 152k-vocab row (queued behind a forward, batch 1: top-k
# 0.72 vs 0.52 ms, n_probs 1.30 vs 0.79, grammar 1.52 vs 0.66), and from 8 rows less (1.6-2.7x
# faster at 8, 15-36x at 64). Greedy rows stay on the device at any size (4.3x faster at 1 row);
# overlapped steps (`sample_ids`) sample on the device whatever their size: their launches hide
# under the next forward.
DEVICE_MIN_ROWS = 8


class StepSampling:
    def __init__(self, vocab_size: int, synth_probs: tuple[float, ...] = (), eog: frozenset[int] = frozenset(),
                 on_device: bool | None = None, device_min_rows: int | None = None, fim: InfillVocab | None = None) -> None:
        """synth_probs, eog: --spec-synth-*'s acceptance (speculative/verify.py `synth_run`).
        on_device: None (service) runs the device sampler on logits off the CPU and the host path
        on CPU logits; True the device path on any logits (the tests run it on CPU tensors); False
        the host path on any (the benchmark's baseline). device_min_rows: below it non-greedy rows
        take the host path (default DEVICE_MIN_ROWS in service, 0 when on_device is forced).
        fim: the vocabulary the infill sampler reads (host path only: the device serves no such chain)."""
        self.sampler = Sampler(vocab_size, fim)
        self.device = DeviceSampler(vocab_size)
        self.synth_probs, self.eog, self.on_device = synth_probs, eog, on_device
        self.min_rows = device_min_rows if device_min_rows is not None else (DEVICE_MIN_ROWS if on_device is None else 0)

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
        tokens. Greedy rows take the argmax pass; others, off the CPU (or with on_device), the
        device sampler where it needs no host view (no probabilities or penalties: `DeviceSampler.ids`)."""
        seqs = [c.seq for c in plan.chunks if c.sample]
        try:
            ids = greedy_ids_device(logits, [s.params for s in seqs])
        except SamplingError:
            return None   # a bad logit_bias id: the host path names it and fails only its request
        if ids is None and (self.on_device or (self.on_device is None and not logits.is_cpu)):
            ids = self.device.ids(logits, [s.params for s in seqs], [s.rng for s in seqs])
        return None if ids is None else SampledIds(ids)

    def _sample_rows(self, seqs, logits: torch.Tensor | None, allowed: torch.Tensor | None) -> list[Sampled]:
        """One token per row (the step's sampling without drafts)."""
        if not seqs:
            return []
        forced = [s.reasoning.forced_token if s.reasoning is not None else None for s in seqs]
        if logits is not None and (self.on_device or (self.on_device is None and not logits.is_cpu)):
            return self._split(seqs, logits, allowed, forced)
        return self._on_host(seqs, logits, allowed, forced)

    def _split(self, seqs, logits: torch.Tensor, allowed: torch.Tensor | None, forced) -> list[Sampled]:
        """Logits on the device: the rows the device sampler serves are sampled there (ids and
        probabilities come back); only the others' rows (forcing a reasoning budget, or off the
        plain chain: DRY, XTC, mirostat...) are copied to the host sampler. docs/architecture.md
        ("Sampling on the device")."""
        few = len(seqs) < self.min_rows
        dev = [i for i, (s, f) in enumerate(zip(seqs, forced)) if f is None and self.device.serves(s.params, s.tokens)
               and not (few and not (s.params.greedy and not s.params.n_probs))]
        host = sorted(set(range(len(seqs))) - set(dev))
        out: list[Sampled | None] = [None] * len(seqs)
        for part, run in ((dev, self._device_rows), (host, self._host_rows)):
            if part:
                for i, s in zip(part, run([seqs[i] for i in part], _rows_of(logits, part), _rows_of(allowed, part),
                                         [forced[i] for i in part])):
                    out[i] = s
        return out

    def _device_rows(self, seqs, logits: torch.Tensor, allowed: torch.Tensor | None, forced) -> list[Sampled]:
        try:
            res = self.device.sample(logits, [s.params for s in seqs], [s.rng for s in seqs],
                                     [s.tokens for s in seqs], allowed)
        except SamplingError:   # raised before any draw: the host path answers (and names the problem)
            return self._on_host(seqs, logits.cpu(), allowed, forced)
        out = _sampled(res.output, seqs)
        for i in res.bad:   # NaN, or nothing allowed: the host names the cause and fails that request alone
            out[i] = self._rows([seqs[i]], logits[i: i + 1].cpu(), None if allowed is None else allowed[i: i + 1])[0]
        return out

    def _host_rows(self, seqs, logits: torch.Tensor, allowed: torch.Tensor | None, forced) -> list[Sampled]:
        return self._on_host(seqs, logits.cpu(), allowed, forced)

    def _on_host(self, seqs, logits: torch.Tensor | None, allowed: torch.Tensor | None, forced) -> list[Sampled]:
        """The host sampler on CPU logits (every row of a CPU step)."""
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


def _rows_of(t: torch.Tensor | None, rows: list[int]) -> torch.Tensor | None:
    """Rows of a tensor in order (the tensor itself when they are all of it). The index goes to a
    GPU without a sync, so the device rows' sampling queues behind the forward."""
    if t is None or len(rows) == t.shape[0]:
        return t
    return t[upload(torch.tensor(rows), t.device)]


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
    has_top = out.top_ids is not None and any(s.params.n_probs for s in seqs)
    ids, top_lps = (out.top_ids.tolist(), out.top_logprobs.tolist()) if has_top else ((), ())   # one copy each
    result = []
    for i, s in enumerate(seqs):
        n = s.params.n_probs
        top = ()
        if n and has_top:
            top = tuple((t, lp) for t, lp in zip(ids[i][:n], top_lps[i][:n]) if lp != float("-inf"))
        result.append(Sampled(tokens[i], lps[i], top))
    return result
