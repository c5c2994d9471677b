"""The per-stream state of a hybrid model's recurrent layers, kept beside its KV cache.

A KV stream holds one entry per position, so any prefix of it can be kept and the rest
overwritten. A recurrent layer's state is one fixed-size summary of *every* token it has seen
(model/delta_net.py): it cannot be cut back to a shorter prefix. So each stream records how many
tokens its state has absorbed (`absorbed`), and a forward may only continue a stream exactly where
its state stands, or start it again at position 0 (`begin`, which zeroes the state). Anything else
(a prefix reused past or short of the state, a KV copy the state could not follow) marks the
stream `INVALID`, and a forward continuing it raises rather than computing from the wrong state.
The engine keeps to these rules (engine/recurrent_policy.py); this check is what makes a missed
case an error instead of a wrong answer.

Memory: per stream and recurrent layer, `d_conv - 1` convolution inputs and a [v_heads, head_k,
head_v] float32 matrix (Qwen3.5-0.8B: 18 layers x 1 MiB a stream), allocated at start on the
cache's device. llama.cpp keeps the same f32 states (its `llama_memory_recurrent`).
"""

from __future__ import annotations

import torch

INVALID = -1


class RecurrentState:
    def __init__(self, spec, n_streams: int, device: str | torch.device = "cpu") -> None:
        """spec: the model's RecurrentSpec."""
        n = len(spec.recurrent_layers)
        self.conv = torch.zeros(n, n_streams, spec.d_conv - 1, spec.conv_dim, device=device)   # [L, S, d_conv-1, C]
        self.ssm = torch.zeros(n, n_streams, spec.n_v_heads, spec.head_k, spec.head_v,
                               device=device)                            # [L, S, H, dk, dv]
        self.absorbed = [0] * n_streams
        # model layer -> its row in conv / ssm
        self.row = {layer: j for j, layer in enumerate(spec.recurrent_layers)}

    def begin(self, streams: list[int], starts: list[int]) -> None:
        """Before a forward: each (stream, start) either continues where its state stands or starts
        at 0 (state zeroed); else RuntimeError naming both counts."""
        for stream, start in zip(streams, starts):
            if start == 0:
                self.conv[:, stream].zero_()
                self.ssm[:, stream].zero_()
            elif self.absorbed[stream] != start:
                held = "no valid state" if self.absorbed[stream] == INVALID else f"{self.absorbed[stream]} tokens"
                raise RuntimeError(f"stream {stream}: a recurrent model cannot continue at position {start}: "
                                   f"its state holds {held}")

    def end(self, streams: list[int], ends: list[int]) -> None:
        """After a forward: each stream's state has absorbed its tokens up to `end`."""
        for stream, end in zip(streams, ends):
            self.absorbed[stream] = end

    def copy_stream(self, src: int, dst: int, n: int) -> None:
        """A KV copy of src's first n cells to dst: the state follows when it stands exactly at n."""
        if n and n == self.absorbed[src] and src != dst:
            self.conv[:, dst] = self.conv[:, src]
            self.ssm[:, dst] = self.ssm[:, src]
        self.absorbed[dst] = self.absorbed[src] if n == self.absorbed[src] else (0 if n == 0 else INVALID)

    def trim(self, stream: int, n: int) -> None:
        """The stream keeps its first n cells: a state past them cannot be cut back."""
        if n == 0:
            self.absorbed[stream] = 0
        elif n != self.absorbed[stream]:
            self.absorbed[stream] = INVALID

    def invalidate(self, stream: int) -> None:
        """KV written into the stream from elsewhere (an import): no state matches it."""
        self.absorbed[stream] = INVALID

    def bytes_used(self) -> int:
        return self.conv.numel() * self.conv.element_size() + self.ssm.numel() * self.ssm.element_size()


def recurrent_state(cache, spec) -> RecurrentState:
    """The recurrent states kept with `cache` (a KVCache or a bare layout: `cache.recurrent`), made
    on first use for the cache's streams; spec: the model's RecurrentSpec."""
    state = getattr(cache, "recurrent", None)
    if state is None:
        kv = cache.spec
        with torch.inference_mode(False):   # made in a forward: plain tensors, which the KV moves may edit
            state = cache.recurrent = RecurrentState(spec, kv.n_streams, kv.device)
    return state
