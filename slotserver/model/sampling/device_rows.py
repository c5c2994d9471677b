"""The host half of the device sampler: which rows take which path, and the step's one upload.

Everything the device chain branches on is a request setting, known on the host before the
logits exist, so the rows are sorted into groups here (greedy, truncated draws, untruncated draws,
post_sampling_probs reporters) and the device runs each group's ops on an index list, with no
value read back to decide. The per-row numbers, the index lists, the logit_bias entries and the
penalty windows travel as one float64 tensor (token ids and counts are exact in float64): one
host-to-device copy a step, instead of one per list.
"""

from __future__ import annotations

import array
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from slotserver.model.sampling.params import SamplingParams
from slotserver.model.sampling.penalties import History, _window
from slotserver.runtime.device import upload

OPEN_WIDTH = 256   # candidates a row without top_k gets in the first pass (its end is usually within)
SCALARS = ("temp", "top_k", "top_p", "min_p", "u", "rep", "freq", "pres")


class Upload:
    """Named views of one float64 tensor copied to the device: per-row scalar columns (`col`) and
    segments (`[name]`: index lists as int64, `raw(name)`: float64)."""

    def __init__(self, flat: list[float], spans: dict[str, tuple[int, int]], rows: int, device) -> None:
        self._flat, self._device, self._t = flat, device, None
        self._spans, self._rows, self._cache = spans, rows, {}

    @property
    def tensor(self) -> torch.Tensor:
        """Copied on first use: a step of plain greedy rows reads none of it and copies nothing."""
        if self._t is None:
            flat = torch.frombuffer(array.array("d", self._flat), dtype=torch.float64)   # [n] (faster than from a list)
            self._t = upload(flat, self._device)   # the one copy down
        return self._t

    def col(self, name: str) -> torch.Tensor:
        """A per-row scalar: [B] float64."""
        return self._block()[:, SCALARS.index(name)]

    def cols(self, rows: str, *names: str) -> tuple[torch.Tensor, ...]:
        """Per-row scalars of the rows of index list `rows`: [len] float64 each, one gather for
        all of them (none when the list is every row)."""
        block = self._block()
        if self._spans[rows][1] - self._spans[rows][0] != self._rows:
            block = block.index_select(0, self[rows])                     # [len, len(SCALARS)]
        return tuple(block[:, SCALARS.index(name)] for name in names)

    def _block(self) -> torch.Tensor:
        return self.tensor[: self._rows * len(SCALARS)].view(self._rows, len(SCALARS))   # [B, len(SCALARS)]

    def raw(self, name: str) -> torch.Tensor:
        a, b = self._spans[name]
        return self.tensor[a:b]

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._cache:
            self._cache[name] = self.raw(name).long()
        return self._cache[name]


@dataclass
class SampleRows:
    """One device sampling call's rows, grouped by the path each takes (lists of row indices)."""

    params: list[SamplingParams]
    draws: list[float]                  # each row's uniform (0.0 where the host draws none)
    windows: list[Sequence[int]]        # each row's penalty window (empty when penalties are off)
    vocab: int
    masked: list[int]                   # rows with a grammar mask
    bits: np.ndarray | None             # their masks, packed: uint8 [len(masked), ceil(V / 8)]
    n_probs: int | None = None          # the report's columns (a subset keeps its batch's)

    @classmethod
    def build(cls, params, draws, history: History, vocab: int,
              packed: tuple[list[int], np.ndarray | None]) -> SampleRows:
        windows = [_window(p, h) for p, h in zip(params, history)]
        return cls(list(params), list(draws), windows, vocab, packed[0], packed[1])

    def subset(self, idx: list[int]) -> SampleRows:
        """The same rows' settings and draws (no new draw), for a second pass over some rows."""
        where = {r: j for j, r in enumerate(self.masked)}
        masked = [k for k, r in enumerate(idx) if r in where]
        bits = self.bits[[where[idx[k]] for k in masked]] if masked else None
        return SampleRows([self.params[i] for i in idx], [self.draws[i] for i in idx],
                          [self.windows[i] for i in idx], self.vocab, masked, bits, self.n)

    def top_k(self, p: SamplingParams) -> int:
        return p.top_k if 0 < p.top_k < self.vocab else self.vocab     # vocab: off

    def untruncated(self, p: SamplingParams) -> bool:
        """A row that draws over the whole vocabulary in vocabulary order, as the host does: the
        fast path when top_k, top_p and min_p are all off; a post_sampling_probs row (chain.py)
        only when top_k <= 0, since its top_k >= vocab sorts the candidates, and a draw over
        sorted candidates picks another token for the same uniform."""
        off = p.top_k <= 0 if p.post_sampling_probs else self.top_k(p) == self.vocab
        return off and p.top_p >= 1 and p.min_p <= 0

    @cached_property
    def sorted_rows(self) -> list[int]:
        return [i for i, p in enumerate(self.params) if not p.greedy and not self.untruncated(p)]

    @cached_property
    def sorted_post(self) -> list[int]:
        """Positions, within `sorted_rows`, of the post_sampling_probs rows."""
        return [j for j, i in enumerate(self.sorted_rows) if self.params[i].post_sampling_probs]

    @cached_property
    def post_of_sorted(self) -> list[int]:
        return [i for i in self.sorted_rows if self.params[i].post_sampling_probs]

    def _untruncated_rows(self, post: bool) -> list[int]:
        return [i for i, p in enumerate(self.params)
                if not p.greedy and self.untruncated(p) and p.post_sampling_probs == post]

    @cached_property
    def vocab_fast(self) -> list[int]:
        return self._untruncated_rows(False)

    @cached_property
    def vocab_post(self) -> list[int]:
        return self._untruncated_rows(True)

    @cached_property
    def greedy_post(self) -> list[int]:
        return [i for i, p in enumerate(self.params) if p.greedy and p.post_sampling_probs]

    @cached_property
    def bias(self) -> list[tuple[int, int, float]]:
        return [(r, t, b) for r, p in enumerate(self.params) for t, b in p.logit_bias]

    @cached_property
    def pen_width(self) -> int:
        return max((len(w) for w in self.windows), default=0)

    @cached_property
    def width(self) -> int:
        """The first pass's candidates per sorted row: the largest top_k, and OPEN_WIDTH if any
        row has none (top_p / min_p end it; a row whose end is further is redone in full)."""
        def need(p: SamplingParams) -> int:
            k = self.top_k(p)
            if k < self.vocab:
                return k
            return OPEN_WIDTH if p.top_p < 1 or p.min_p > 0 else self.vocab   # else: every token, sorted
        return min(self.vocab, max((need(self.params[i]) for i in self.sorted_rows), default=1))

    @cached_property
    def needs_lse(self) -> bool:
        return any(self.top_k(self.params[i]) == self.vocab and self.params[i].top_p < 1 for i in self.sorted_rows)

    @cached_property
    def n(self) -> int:
        if self.n_probs is not None:
            return self.n_probs
        return min(max((p.n_probs for p in self.params), default=0), self.vocab)

    def upload(self, device) -> Upload:
        """Every number the device chain reads, in one float64 tensor on `device`."""
        flat: list[float] = []
        for p, u in zip(self.params, self.draws):
            flat += (p.temperature, self.top_k(p), p.top_p, p.min_p, u, p.repeat_penalty, p.frequency_penalty,
                     p.presence_penalty)
        spans: dict[str, tuple[int, int]] = {}
        bias = self.bias
        pen = self.pen_width
        segments = {
            "sorted": self.sorted_rows, "sorted_post": self.sorted_post, "post_of_sorted": self.post_of_sorted,
            "vocab_fast": self.vocab_fast, "vocab_post": self.vocab_post, "greedy_post": self.greedy_post,
            "masked": self.masked, "bias": [x for part in zip(*bias) for x in part] if bias else [],
            "pen": list(itertools.chain.from_iterable(list(w) + [-1] * (pen - len(w)) for w in self.windows))
            if pen else [],
        }
        for name, values in segments.items():
            spans[name] = (len(flat), len(flat) + len(values))
            flat += values
        return Upload(flat, spans, len(self.params), device)
