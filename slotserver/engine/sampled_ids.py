"""One step's sampled token ids where the logits are, and their copy on its way to the host.

Why: an overlapped decode step (engine/overlap.py) takes its input tokens from the previous step's
sampled ids on the device, and reads them on the host only after it has launched the next forward.
`SampledIds` holds both ends: `tokens` (the device tensor the next batch copies from) and a
non-blocking copy into pinned host memory with an event recorded behind it, which `rows()` waits
for. On the CPU the ids are already on the host: no copy, no event, the same code path.

The producer is any device sampler that returns int64 `[2, rows]` (tokens, then 1 where the row's
logits were usable, else 0): greedy today (`greedy_ids_device`); a device top-k/top-p sampler can
feed the same hook. A row flagged 0 becomes that row's error, as the host path reports it.
"""

from __future__ import annotations

import torch

from slotserver.engine.postprocess import Sampled
from slotserver.model.sampling.greedy import NOT_FINITE
from slotserver.runtime.device import upload


class SampledIds:
    def __init__(self, ids: torch.Tensor) -> None:
        """ids: int64 [2, rows] on the logits' device (row 0 the tokens, row 1 the usable flags)."""
        self.tokens = ids[0]                                     # [rows] where the model runs
        if ids.is_cpu:
            self._host, self._event = ids, None
            return
        self._host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
        self._host.copy_(ids, non_blocking=True)                 # queued behind the sampler's kernels
        self._event = torch.cuda.Event()
        self._event.record()

    def gather(self, rows: list[int]) -> torch.Tensor:
        """The device tokens of `rows` (all of them: no copy), for a next step without some sequences."""
        if len(rows) == self.tokens.shape[0]:
            return self.tokens
        idx = upload(torch.tensor(rows, dtype=torch.int64), self.tokens.device)   # no wait for the step in flight
        return self.tokens.index_select(0, idx)

    def ready(self) -> bool:
        """Whether the host copy has landed (never blocks)."""
        return self._event is None or self._event.query()

    def rows(self) -> list[Sampled]:
        """One `Sampled` per row, in the step's sampling order; waits for the copy if needed."""
        if self._event is not None:
            self._event.synchronize()
        tokens, ok = self._host.tolist()
        return [Sampled(t) if good else Sampled(-1, error=f"sampling failed: {NOT_FINITE}")
                for t, good in zip(tokens, ok)]
