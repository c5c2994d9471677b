"""Token sampling with llama.cpp's sampler chain, vectorised over a batch of sequences.

Every chain starts with logit_bias. Rows whose chain is llama.cpp's default with only penalties,
top_k, top_p, min_p and temperature active (`SamplingParams.plain_chain`; nearly every request)
take the batched fast path here: logit_bias -> penalties -> top_k -> top_p -> min_p -> temperature
-> draw, one uniform per row from the row's own SequenceRng. Greedy (temperature <= 0) is the
argmax after logit_bias and penalties and uses no random draw. Any other row (typical_p, DRY, XTC,
top_n_sigma, dynamic temperature, min_keep, mirostat, adaptive-p, a custom `samplers` order, or
post_sampling_probs) runs llama.cpp's full chain for its row alone (chain.py).

top_k, top_p and min_p each keep a *prefix* of the logits sorted in descending order, so a row's
kept set is the shortest of the three prefixes, and a `topk` of a few candidates per row replaces
a full vocabulary sort whenever that prefix is short (the usual case).

n_probs / logprobs, as llama-server reports them: by default the softmax of the model's raw logits,
before logit_bias and every sampler (so with ignore_eos the end-of-generation token shows the
model's own probability); with post_sampling_probs, the chain's final distribution (after
truncation and temperature), only its tokens with p > 0; missing columns are padded with -inf.
"""

from __future__ import annotations

import math
import random
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from slotserver.model.sampling.truncated import top_rows, truncated_tokens
from slotserver.model.sampling.row import draw, keep_length
from slotserver.model.sampling.chain import ChainResult, SamplerState, run_chain
from slotserver.model.sampling.infill import InfillVocab
from slotserver.model.sampling.penalties import History, _row_values, apply_logit_bias_, apply_penalties, apply_penalties_
from slotserver.model.sampling.params import MAX_N_PROBS, SamplingError, SamplingParams, _int

__all__ = ["MAX_N_PROBS", "SamplingError", "SamplingParams"]  # re-exported from slotserver.model.sampling.params
__all__ += ["History", "SampleOutput", "SequenceRng", "SamplerState", "Sampler"]
__all__ += ["apply_logit_bias_", "apply_penalties_", "apply_penalties"]


@dataclass
class SampleOutput:
    """One token per row. The probability fields are None unless some row has n_probs > 0; then
    they are filled for every row, and row i reads the first n_probs columns of the top fields."""

    tokens: torch.Tensor  # [batch] int64
    logprobs: torch.Tensor | None  # [batch] float32, the chosen token's log-probability
    top_ids: torch.Tensor | None  # [batch, max_n_probs] int64, most probable first
    top_logprobs: torch.Tensor | None  # [batch, max_n_probs] float32


def _mt19937_state(seed: int) -> tuple:
    """Python's Mersenne Twister state equal to C++'s `std::mt19937(seed)` (init_genrand; Python's
    own seeding goes through init_by_array and would give other numbers)."""
    mt = [seed & 0xFFFFFFFF]
    for i in range(1, 624):
        mt.append((1812433253 * (mt[-1] ^ (mt[-1] >> 30)) + i) & 0xFFFFFFFF)
    return (3, (*mt, 624), None)


class SequenceRng:
    """A sequence's own random stream: same seed, same draws, whatever else is in the batch. It also
    carries the sequence's `SamplerState` (mirostat's mu...), created and dropped with it.

    The draws are llama.cpp's: `std::mt19937(seed)` read through libstdc++'s
    `uniform_real_distribution<double>(0, 1)` (two 32-bit outputs, low word first, over 2^64), so a
    seed draws the same uniforms as in llama-server and, where the logits agree, picks the same token.
    """

    def __init__(self, seed: int = -1) -> None:
        seed = _int("seed", seed, lo=-1)
        self.seed = secrets.randbits(32) if seed == -1 else seed  # reported back to the client
        # made at the first draw: building the 624-word state is ~0.15 ms of Python, paid on the
        # event loop (Engine.submit) by every request, and a greedy one never draws
        self._rng: random.Random | None = None
        self.state = SamplerState()

    def next_uniform(self) -> float:
        """A float in [0, 1): libstdc++'s generate_canonical<double, 53> over std::mt19937."""
        rng = self._rng
        if rng is None:
            rng = self._rng = random.Random()
            rng.setstate(_mt19937_state(self.seed))
        low, high = rng.getrandbits(32), rng.getrandbits(32)
        u = (low + (high << 32)) / 18446744073709551616.0
        return u if u < 1.0 else math.nextafter(1.0, 0.0)


def row_logsumexp(rows: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Each row's logsumexp: rows [n, vocab] float32, shift [n] (the row's max) -> [n].

    Row by row, because what is reported must not depend on the rows beside it (a scoring client
    compares a prompt's logprobs alone and under load): torch's batched exp, sum and log split
    their work by the batch's total size (threads' chunks of a [n, vocab] reduction, vector bodies
    and scalar tails of an elementwise op), and 3 of 8 prompts reported logprobs up to 1.9e-6 apart
    alone and among 8 (issue 32). A lone row's ops see only its own vocab-sized data, so they split
    the same way in any batch. Costs ~20 us a row more than the batched form (vocab 49152, 2
    threads), paid only by rows that report probabilities or need top_p's whole-vocab mass."""
    shift = torch.where(shift.isfinite(), shift, 0.0)    # as torch.logsumexp: an infinite max shifts by 0
    return torch.stack([m + (row - m).exp_().sum().log() for row, m in zip(rows, shift)]) if len(rows) \
        else shift.clone()


def _stable(vals: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k candidates [batch, width] re-ordered as the native pass orders them: value descending,
    the lower id first on ties (torch.topk leaves ties in no defined order)."""
    by_id = ids.argsort(dim=1)
    vals, ids = vals.gather(1, by_id), ids.gather(1, by_id)
    order = torch.sort(vals, dim=1, descending=True, stable=True).indices
    return vals.gather(1, order), ids.gather(1, order)


def _inverse_cdf(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Per row, the first column whose cumulative weight exceeds u * total (overwrites `weights`).

    Weights need not be normalised. Searching right of the target never lands on a zero-weight
    column, and the target stays below the total so rounding cannot run past the last column.
    """
    cdf = weights.cumsum_(dim=1)  # [rows, cols]
    total = cdf[:, -1:]  # [rows, 1]
    target = torch.minimum((uniform[:, None] * total).to(cdf.dtype), torch.nextafter(total, total.new_zeros(())))
    return torch.searchsorted(cdf, target, right=True).squeeze(1).clamp(max=cdf.shape[1] - 1)  # [rows]


class _Batch:
    """The adjusted logits of one sample() call, per-row settings, and reductions computed once.

    When the vocab splits into blocks of 16-128 columns, row maxima and top candidates come from
    per-block maxima: the k largest logits lie in the k blocks with the largest maxima, so a top-k
    reads only k blocks after one `amax` pass (about 3x faster than torch.topk on CPU).
    """

    def __init__(self, adj: torch.Tensor, params: Sequence[SamplingParams], fast: Sequence[bool]) -> None:
        self.adj, self.params, self.vocab = adj, params, adj.shape[1]  # adj: [batch, vocab] float32
        self.greedy = [p.greedy or not f for p, f in zip(params, fast)]  # full-chain rows draw elsewhere
        self.top_k_list = [p.top_k if 0 < p.top_k < self.vocab else self.vocab for p in params]  # vocab: off
        self.block = next((n for n in (64, 128, 32, 16) if self.vocab % n == 0 and self.vocab >= 8 * n), 0)
        if self.block:
            self.blocks = adj.reshape(adj.shape[0], -1, self.block)  # [batch, n_blocks, block]
            self.block_max = self.blocks.amax(dim=2)  # [batch, n_blocks]
            self.row_max, best = self.block_max.max(dim=1)  # [batch] each; first block on ties
            inner = self.blocks.gather(1, best[:, None, None].expand(-1, 1, self.block))  # [batch, 1, block]
            self.argmax = best * self.block + inner.squeeze(1).argmax(dim=1)  # first index on ties
        else:
            self.row_max, self.argmax = adj.max(dim=1)  # [batch] each
        self.report_from_adj = True  # n_probs come from adj (no bias/penalty edits) rather than the raw logits
        self._lse: torch.Tensor | None = None
        self._top: tuple[torch.Tensor, torch.Tensor] | None = None

    def values(self, name: str) -> torch.Tensor:
        return _row_values(self.params, name, self.adj.device)  # [batch]

    @property
    def lse(self) -> torch.Tensor:
        """Full-vocabulary logsumexp [batch]: every row when probabilities are reported, else only
        rows using top_p without top_k; NaN in rows that never read it (skipping their exps is most
        of the cost)."""
        if self._lse is None:
            report = self.report_from_adj and any(p.n_probs > 0 for p in self.params)
            need = [
                report or (not g and k == self.vocab and p.top_p < 1)
                for p, g, k in zip(self.params, self.greedy, self.top_k_list)
            ]
            idx = torch.tensor([i for i, n in enumerate(need) if n], dtype=torch.int64, device=self.adj.device)
            shift = self.row_max.index_select(0, idx)  # [n]
            rows = self.adj if all(need) else self.adj.index_select(0, idx)  # [n, vocab]
            self._lse = torch.full_like(self.row_max, math.nan).index_copy_(0, idx, row_logsumexp(rows, shift))
        return self._lse

    def topk(self, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The `width` largest logits per row, descending, and their ids: [batch, width] each."""
        if self._top is None or self._top[0].shape[1] < width:
            if self.block and 2 * width * self.block <= self.vocab:
                best = torch.topk(self.block_max, width, dim=1).indices[:, :, None]  # [batch, width, 1]
                cand = self.blocks.gather(1, best.expand(-1, -1, self.block)).flatten(1)  # [batch, width*block]
                cand_ids = (best * self.block + torch.arange(self.block, device=best.device)).flatten(1)
                vals, pos = torch.topk(cand, width, dim=1)  # [batch, width] each
                self._top = vals, cand_ids.gather(1, pos)
            else:
                self._top = torch.topk(self.adj, width, dim=1)
        return self._top[0][:, :width], self._top[1][:, :width]


class Sampler:
    """Samples one token per row of a logits batch, each row with its own params and RNG.

    It reuses one float32 [batch, vocab] scratch buffer across calls (a fresh multi-MB allocation
    per step costs page faults comparable to the whole step), so use it from one thread at a time.
    """

    def __init__(self, vocab_size: int, fim: InfillVocab | None = None) -> None:
        self.vocab_size = _int("vocab_size", vocab_size, lo=1)
        self.fim = fim   # the infill sampler's view of the vocabulary (model/sampling/infill.py)
        self._buffer: torch.Tensor | None = None

    def sample(
        self, logits: torch.Tensor, params: Sequence[SamplingParams], rngs: Sequence[SequenceRng], history: History,
        allowed: torch.Tensor | None = None,
    ) -> SampleOutput:
        """logits [batch, vocab] (any float dtype, computed in float32, never modified); history[i]
        is row i's token ids, of which the sampler itself takes the last repeat_last_n. `allowed`
        [batch, vocab] bool: a grammar's mask, applied like a -inf logit bias (before penalties and
        every sampler; n_probs still report the model's own distribution)."""
        batch = logits.shape[0] if logits.dim() == 2 else -1
        if logits.dim() != 2 or logits.shape[1] != self.vocab_size:
            raise SamplingError(f"logits must be [batch, {self.vocab_size}], got {tuple(logits.shape)}")
        if not len(params) == len(rngs) == len(history) == batch:
            raise SamplingError(f"params, rngs and history must each have {batch} rows")
        # one C pass for greedy and top_k-truncated rows (the usual requests: truncated.py)
        fast_tokens = truncated_tokens(logits, params, rngs, self._scratch(logits), history) if allowed is None else None
        if fast_tokens is not None:
            return SampleOutput(fast_tokens, None, None, None)
        fast = [p.plain_chain and not p.post_sampling_probs for p in params]
        edits = allowed is not None or any(p.logit_bias or (f and p.penalties_active) for p, f in zip(params, fast))
        adj = self._scratch(logits).copy_(logits) if edits else logits.to(torch.float32)  # [batch, vocab]
        if allowed is not None:
            adj.masked_fill_(~allowed, -math.inf)
        fast_history = [h if f else () for h, f in zip(history, fast)]  # full-chain rows: penalties in order
        b = _Batch(apply_penalties_(apply_logit_bias_(adj, params), params, fast_history), params, fast)
        b.report_from_adj = not edits
        bad = ~torch.isfinite(b.row_max)  # NaN propagates through max, so NaN logits land here too
        if bool(bad.any()):
            row = int(bad.nonzero()[0])
            raise SamplingError(f"row {row}: logits are NaN/inf, or logit_bias or a grammar forbids every token")
        tokens = b.argmax  # [batch]
        if not all(b.greedy):
            uniform = [0.0 if g else r.next_uniform() for r, g in zip(rngs, b.greedy)]  # one draw per row
            tokens = self._draw(b, torch.tensor(uniform, dtype=torch.float64, device=adj.device))
        chains = {i: run_chain(b.adj[i], params[i], rngs[i], history[i], self.fim) for i, f in enumerate(fast) if not f}
        if chains:
            idx = torch.tensor(list(chains), device=adj.device)
            tokens = tokens.index_copy(0, idx, torch.tensor([r.token for r in chains.values()], device=adj.device))
        return self._report(logits, b, tokens, chains, raw_is_adj=not edits)

    def scratch_for(self, logits: torch.Tensor) -> torch.Tensor:
        """A float32 buffer of the logits' shape, reused across calls (the native pass's scratch rows, greedy_tokens')."""
        return self._scratch(logits)

    def _scratch(self, logits: torch.Tensor) -> torch.Tensor:
        buf = self._buffer
        if buf is None or buf.shape[0] < logits.shape[0] or buf.device != logits.device:
            buf = self._buffer = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
        return buf[: logits.shape[0]]

    def _draw(self, b: _Batch, uniform: torch.Tensor) -> torch.Tensor:
        """Non-greedy rows: untruncated ones draw over the whole vocab, the others over sorted candidates."""
        untruncated = [
            not g and k == b.vocab and p.top_p >= 1 and p.min_p <= 0
            for p, g, k in zip(b.params, b.greedy, b.top_k_list)
        ]
        rows = [not g and not u for g, u in zip(b.greedy, untruncated)]
        tokens = b.argmax
        if any(rows):
            tokens = torch.where(torch.tensor(rows, device=b.adj.device), self._draw_sorted(b, uniform, rows), tokens)
        if any(untruncated):  # no sort needed: the CDF can run in vocabulary order
            idx = torch.tensor([i for i, u in enumerate(untruncated) if u], device=b.adj.device)  # [n]
            shift, temp = b.row_max[idx, None], b.values("temperature")[idx, None]  # [n, 1] each
            weights = b.adj.index_select(0, idx).sub_(shift).div_(temp).exp_()  # [n, vocab]
            tokens = tokens.index_copy(0, idx, _inverse_cdf(weights, uniform[idx]))
        return tokens

    def _draw_sorted(self, b: _Batch, uniform: torch.Tensor, rows: list[bool]) -> torch.Tensor:
        """top_k -> top_p -> min_p -> temperature -> draw, on each row's descending top candidates
        (the batched top-k here, each row's arithmetic in row.py).

        A row with top_k on needs its whole top_k prefix (top_p renormalises over top_k's
        survivors). A row without top_k is open: its kept set ends where top_p's mass or min_p's
        floor is reached, unknown before sorting, so the width starts from a guess and grows until
        every open row's end is in view. Peaked distributions thus never sort the vocabulary.
        """
        is_open = [r and k == b.vocab for r, k in zip(rows, b.top_k_list)]
        width = max((k for k, r, o in zip(b.top_k_list, rows, is_open) if r and not o), default=1)
        width = max(width, min(b.vocab, 64)) if any(is_open) else width
        picked = [i for i, r in enumerate(rows) if r]
        while True:
            # the native pass's candidates where it can (truncated.py: the same order, ties included,
            # so a seeded row draws alike on both paths), else the batched top-k
            vals, ids = top_rows(b.adj, width) or _stable(*b.topk(width))  # [batch, width] each
            cand = vals.tolist()
            keeps = {i: self._keep(b, i, cand[i], is_open[i]) for i in picked}
            if width == b.vocab or all(done for _, done in keeps.values()):
                break
            width = min(b.vocab, width * 8)
        tokens, us, id_rows = b.argmax.tolist(), uniform.tolist(), ids.tolist()
        for i in picked:
            tokens[i] = id_rows[i][draw(cand[i], keeps[i][0], b.params[i].temperature, us[i])]
        return torch.tensor(tokens, dtype=torch.int64, device=b.adj.device)

    @staticmethod
    def _keep(b: _Batch, i: int, vals: list[float], is_open: bool) -> tuple[int, bool]:
        p, k = b.params[i], b.top_k_list[i]
        lse = float(b.lse[i]) if is_open and p.top_p < 1 and k > len(vals) else None   # top_p over the vocab
        return keep_length(vals, k, p.top_p, p.min_p, is_open, lse)

    def _report(self, raw: torch.Tensor, b: _Batch, tokens: torch.Tensor, chains: dict[int, ChainResult],
                raw_is_adj: bool) -> SampleOutput:
        """Chosen-token logprob and top-n alternatives: the raw logits' softmax, or, for rows with
        post_sampling_probs, their chain's final distribution."""
        n_probs = min(max((p.n_probs for p in b.params), default=0), self.vocab_size)
        if n_probs == 0:
            return SampleOutput(tokens, None, None, None)
        if raw_is_adj:
            lse, (top_vals, top_ids), scores = b.lse[:, None], b.topk(n_probs), b.adj  # [batch, 1], [batch, n] x2
        else:
            scores = raw.to(torch.float32)  # [batch, vocab]
            lse = row_logsumexp(scores, scores.amax(dim=1))[:, None]  # [batch, 1]
            top_vals, top_ids = torch.topk(scores, n_probs, dim=1)
        chosen = (scores.gather(1, tokens[:, None]) - lse).squeeze(1)  # [batch]
        top_ids, top_lps = top_ids.contiguous(), top_vals - lse
        for i, r in chains.items():
            if b.params[i].post_sampling_probs:
                m = min(n_probs, r.ids.numel())
                top_ids[i], top_lps[i] = 0, -math.inf
                top_ids[i, :m], top_lps[i, :m] = r.ids[:m].to(top_ids.device), r.logprobs[:m].to(top_lps.device)
                hit = (r.ids == r.token).nonzero()
                chosen[i] = float(r.logprobs[int(hit[0])]) if hit.numel() else -math.inf
        return SampleOutput(tokens, chosen, top_ids, top_lps)
