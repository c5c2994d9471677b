"""The plain sampler chain where the logits are: a GPU step sends down a few kilobytes of settings
and brings back ids and the requested probabilities, never the [rows, vocab] logits.

`DeviceSampler.sample(logits, params, rngs, history, allowed)` serves rows on the plain chain
(`SamplingParams.plain_chain`: logit_bias -> penalties -> top_k -> top_p -> min_p -> temperature
-> draw, greedy = the argmax after bias and penalties), with or without a grammar mask, with
n_probs as llama-server reports them (the raw softmax by default; with post_sampling_probs the
chain's final distribution). It gives the host `Sampler`'s answer for the same logits and seeds:
- the uniform of each drawing row comes from that row's own `SequenceRng` on the host, drawn as
  often as the host path draws it (non-greedy rows, and every post_sampling_probs row, whose host
  chain always ends in `dist`), and goes down in the step's one upload;
- the arithmetic is the host's (device_chain.py), so tokens agree wherever the logits are not at
  a rounding boundary, and probabilities to float32 rounding.

One upload (`SampleRows.upload`: every per-row scalar, the bias entries, the penalty windows and the
row index lists in one float64 tensor; the constrained rows' masks as packed bits), one download
(`[rows, 4 + 2n]` float64: token, chosen logprob, a finite flag, a done flag, n top ids, n top
logprobs). A row whose logits have no finite maximum (NaN, or a mask and bias that forbid every
token) comes back in `bad`: the caller fails it on the host with the host's message. A row whose
top_p / min_p end was not within the first pass's candidates (an open row on a flat distribution)
is redone once with the whole vocabulary sorted (a second round trip, rare).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from slotserver.model.sampling.device_chain import draw_sorted, draw_vocab, keep_lengths, penalize_, top_candidates, \
    unpack_bits, vocab_final
from slotserver.model.sampling.device_rows import OPEN_WIDTH, SampleRows, Upload
from slotserver.model.sampling.greedy import greedy_tokens_device
from slotserver.model.sampling.params import SamplingError, SamplingParams
from slotserver.model.sampling.penalties import History, _window
from slotserver.model.sampling.sampler import SampleOutput, SequenceRng
from slotserver.runtime.device import upload

__all__ = ["DeviceResult", "DeviceSampler", "OPEN_WIDTH"]


@dataclass
class DeviceResult:
    """`output` as `Sampler.sample` returns it (CPU tensors; rows listed in `bad` hold no answer)."""

    output: SampleOutput
    bad: list[int]   # rows whose adjusted logits have no finite maximum


class DeviceSampler:
    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def serves(self, p: SamplingParams, history: Sequence[int]) -> bool:
        """The rows this sampler answers: the plain chain, with bias and history ids in the
        vocabulary (others go to the host, which names the bad id in its error)."""
        v = self.vocab_size
        if not p.plain_chain or not all(0 <= t < v for t, _ in p.logit_bias):
            return False
        window = _window(p, history)
        return not window or (min(window) >= 0 and max(window) < v)

    def sample(self, logits: torch.Tensor, params: Sequence[SamplingParams], rngs: Sequence[SequenceRng],
               history: History, allowed: torch.Tensor | None = None) -> DeviceResult:
        """logits [B, V] (any float dtype, any device, never modified); rows that `serves`;
        allowed: bool [B, V] on the host (a grammar's mask) or None. Raises SamplingError, before
        any draw, for a batch of the wrong shape (as the host's sampler does)."""
        if logits.dim() != 2 or logits.shape[1] != self.vocab_size or not len(params) == len(rngs) == logits.shape[0]:
            raise SamplingError(f"logits must be [batch, {self.vocab_size}] with a row per sequence, "
                                f"got {tuple(logits.shape)} for {len(params)}")
        if allowed is None:   # every row plain greedy, no penalty, no probabilities: the argmax pass alone
            try:
                tokens = greedy_tokens_device(logits, params)
            except SamplingError:
                tokens = None     # a NaN row: the chain below finds which
            if tokens is not None:
                return DeviceResult(SampleOutput(tokens, None, None, None), [])
        draws = [rng.next_uniform() if (not p.greedy or p.post_sampling_probs) else 0.0 for p, rng in zip(params, rngs)]
        rows = SampleRows.build(params, draws, history, self.vocab_size, _pack(allowed))
        out = self._run(logits, rows, full=False)                       # [B, 4 + 2n] on the host
        redo = [i for i, (ok, done) in enumerate(out[:, 2:4].tolist()) if ok and not done]
        if redo:   # open rows whose end lay past the first pass's candidates: sort their whole rows
            idx = torch.tensor(redo)
            out[idx] = self._run(logits[idx.to(logits.device)], rows.subset(redo), full=True)
        return _result(out, rows.n)

    def ids(self, logits: torch.Tensor, params: Sequence[SamplingParams],
            rngs: Sequence[SequenceRng]) -> torch.Tensor | None:
        """The tokens without waiting for them (an overlapped step's sampler, engine/overlap.py):
        int64 [2, B] where the logits are (the tokens; 1 where the row's maximum is finite, else 0),
        or None, before any draw, where a row needs the host: probabilities, penalties (its history
        lacks the token still in flight), candidates that may need a second pass (top_p or min_p
        without top_k), or a row `serves` refuses."""
        if logits.shape[1] != self.vocab_size or not all(self._ids_only(p) for p in params):
            return None
        draws = [rng.next_uniform() if not p.greedy else 0.0 for p, rng in zip(params, rngs)]
        rows = SampleRows.build(params, draws, [()] * len(params), self.vocab_size, ([], None))
        _, row_max, token, _, _ = self._chain(logits, rows, rows.upload(logits.device), full=False)
        return torch.stack([token, row_max.isfinite().long()])         # [2, B], left on the device

    def _ids_only(self, p: SamplingParams) -> bool:
        k_off = not 0 < p.top_k < self.vocab_size
        second_pass = not p.greedy and k_off and (p.top_p < 1 or p.min_p > 0)
        return self.serves(p, ()) and not (p.n_probs or p.post_sampling_probs or p.penalties_active or second_pass)

    def _run(self, logits: torch.Tensor, rows: SampleRows, full: bool) -> torch.Tensor:
        """The chain on the device for every row, -> [B, 4 + 2n] float64 on the host (one copy)."""
        up = rows.upload(logits.device)
        adj, row_max, token, done, post = self._chain(logits, rows, up, full)
        chosen, tops = torch.zeros_like(row_max, dtype=torch.float64), []
        if rows.n:
            chosen, top_ids, top_lps = self._report(logits, adj, rows, up, token, *post)
            tops = [top_ids.double(), top_lps]                          # [B, n] each
        head = torch.stack([token.double(), chosen, row_max.isfinite().double(), done.double()], dim=1)  # [B, 4]
        return torch.cat([head, *tops], dim=1).cpu()                    # the one copy back

    def _chain(self, logits: torch.Tensor, rows: SampleRows, up: Upload, full: bool):
        """-> adj [B, V], row_max [B], token [B], done [B], and the truncated post_sampling_probs
        rows' (chosen, ids, logp) or Nones: every sampled token, still on the device."""
        adj = self._adjusted(logits, rows, up)                          # [B, V] float32
        row_max, token = adj.max(dim=1)                                 # [B] each; first index on ties
        done = torch.ones_like(row_max, dtype=torch.bool)
        post_chosen = post_ids = post_logp = None
        if rows.sorted_rows:
            token, done, post_chosen, post_ids, post_logp = self._sorted(adj, rows, up, token, done, full)
        for exact, name in ((False, "vocab_fast"), (True, "vocab_post")):
            if getattr(rows, name):
                i, n = up[name], len(getattr(rows, name))
                t = draw_vocab(_pick(adj, i, n), *up.cols(name, "temp", "u"), _pick(row_max, i, n), exact)
                token = token.index_copy(0, i, t)
        return adj, row_max, token, done, (post_chosen, post_ids, post_logp)

    def _adjusted(self, logits: torch.Tensor, rows: SampleRows, up: Upload) -> torch.Tensor:
        """float32 logits after the grammar mask, logit_bias and penalties (a copy when any edits)."""
        if not (rows.masked or rows.bias or rows.pen_width):
            return logits.float()
        adj = logits.float().clone()
        if rows.masked:
            i = up["masked"]
            bits = unpack_bits(upload(torch.from_numpy(rows.bits), logits.device), self.vocab_size)  # [m, V]
            adj.index_copy_(0, i, adj.index_select(0, i).masked_fill_(~bits, float("-inf")))
        if rows.bias:
            b = up.raw("bias").view(3, -1)                              # rows, token ids, biases
            adj.index_put_((b[0].long(), b[1].long()), b[2].float(), accumulate=True)
        if rows.pen_width:
            penalize_(adj, up["pen"].view(len(rows.params), -1).long(), up.col("rep").float(),
                      up.col("freq").float(), up.col("pres").float())
        return adj

    def _sorted(self, adj, rows: SampleRows, up: Upload, token, done, full: bool):
        """Truncated drawing rows: top_k -> top_p -> min_p -> temperature -> draw on their
        descending candidates; post_sampling_probs rows among them also get their final
        distribution (as chain.py reports it)."""
        i = up["sorted"]
        sub = _pick(adj, i, len(rows.sorted_rows))                      # [s, V]
        width = self.vocab_size if full else rows.width
        vals, ids = top_candidates(sub, width)                          # [s, W] each, descending
        vals = vals.double()
        top_k, top_p, min_p, temp, u = up.cols("sorted", "top_k", "top_p", "min_p", "temp", "u")
        lse = sub.logsumexp(dim=1) if rows.needs_lse and width < self.vocab_size else None
        keep, ok = keep_lengths(vals, top_k.long(), top_p, min_p, lse, self.vocab_size)
        col, logp = draw_sorted(vals, keep, temp, u)
        token = token.index_copy(0, i, ids.gather(1, col[:, None]).squeeze(1))
        done = done.index_copy(0, i, ok)
        if not rows.n or not rows.sorted_post:
            return token, done, None, None, None
        j = up["sorted_post"]                                           # positions within the sorted rows
        chosen = logp.index_select(0, j).gather(1, col.index_select(0, j)[:, None]).squeeze(1)
        return token, done, chosen, ids.index_select(0, j), logp.index_select(0, j)

    def _report(self, logits, adj, rows: SampleRows, up: Upload, token, post_chosen, post_ids, post_logp):
        """chosen [B], top_ids [B, n], top_lps [B, n] (float64 of float32 values, as the host's):
        the raw logits' softmax, then the post_sampling_probs rows' final distributions."""
        n = rows.n
        raw = logits.float()                                            # [B, V]
        lse = raw.logsumexp(dim=1, keepdim=True)                        # [B, 1]
        chosen = (raw.gather(1, token[:, None]) - lse).squeeze(1)       # [B]
        vals, top_ids = torch.topk(raw, n, dim=1)                       # [B, n]
        top_lps = (vals - lse).double()
        chosen = chosen.double()
        report = (top_ids, top_lps, chosen)
        if post_ids is not None:                                        # truncated post rows: their candidates
            report = _put_rows(report, up["post_of_sorted"], post_ids, post_logp, post_chosen)
        if rows.vocab_post:                                             # untruncated post rows: the whole row
            i = up["vocab_post"]
            temp, = up.cols("vocab_post", "temp")
            c, ids, lps = vocab_final(adj.index_select(0, i), temp, token.index_select(0, i), n)
            report = _put_rows(report, i, ids, lps, c)
        if rows.greedy_post:                                            # greedy post rows: {argmax: p = 1}
            i = up["greedy_post"]
            zero = torch.zeros_like(i, dtype=torch.float64)
            report = _put_rows(report, i, token.index_select(0, i)[:, None], zero[:, None], zero)
        top_ids, top_lps, chosen = report
        return chosen.float().double(), top_ids, top_lps.float().double()


def _put_rows(report, idx: torch.Tensor, ids: torch.Tensor, logp: torch.Tensor, chosen: torch.Tensor):
    """(top_ids [B, n], top_lps [B, n], chosen [B]) with rows `idx` replaced by a final
    distribution's first columns: ids / logp [m, w], padded to n columns with (0, -inf) as the
    host pads, and ids 0 wherever logp is -inf (tokens the distribution does not hold)."""
    top_ids, top_lps, old_chosen = report
    n, w = top_ids.shape[1], min(top_ids.shape[1], ids.shape[1])
    lps = torch.full((idx.shape[0], n), float("-inf"), dtype=torch.float64, device=top_lps.device)
    lps[:, :w] = logp[:, :w]
    new_ids = torch.zeros((idx.shape[0], n), dtype=torch.int64, device=top_ids.device)
    new_ids[:, :w] = ids[:, :w]
    new_ids.masked_fill_(lps == float("-inf"), 0)
    return (top_ids.index_copy(0, idx, new_ids), top_lps.index_copy(0, idx, lps),
            old_chosen.index_copy(0, idx, chosen.double()))


def _pick(t: torch.Tensor, idx: torch.Tensor, n: int) -> torch.Tensor:
    """Rows `idx` (n of them) of t; t itself when they are all of its rows (no [B, V] copy)."""
    return t if n == t.shape[0] else t.index_select(0, idx)


def _pack(allowed: torch.Tensor | None) -> tuple[list[int], np.ndarray | None]:
    """The constrained rows of a host mask (free rows, all True, stay behind) and their bits,
    packed 8 a byte: 19 KB a row at a 152k vocabulary instead of 152 KB of bools."""
    if allowed is None:
        return [], None
    packed = np.packbits(allowed.numpy(), axis=1, bitorder="little")   # [B, ceil(V / 8)]
    vocab, full = allowed.shape[1], packed.shape[1] * 8
    tail = np.uint8((1 << (8 - (full - vocab))) - 1) if full > vocab else np.uint8(255)
    free = (packed[:, :-1] == 255).all(axis=1) & (packed[:, -1] == tail)
    rows = [i for i in range(len(packed)) if not free[i]]
    return rows, packed[rows] if rows else None


def _result(out: torch.Tensor, n: int) -> DeviceResult:
    """[B, 4 + 2n] float64 -> SampleOutput as the host's sampler fills it."""
    bad = [i for i, ok in enumerate(out[:, 2].tolist()) if not ok]
    tokens = out[:, 0].long()
    if not n:
        return DeviceResult(SampleOutput(tokens, None, None, None), bad)
    return DeviceResult(SampleOutput(tokens, out[:, 1].float(), out[:, 4: 4 + n].long(), out[:, 4 + n:].float()), bad)
