"""The per-stream state of a hybrid model's recurrent layers, kept beside its KV cache.

A KV stream holds one entry per position, so any prefix of it can be kept and the rest
overwritten. A recurrent layer's state is one fixed-size summary of *every* token it has seen
(model/delta_net.py): it cannot be cut back to a shorter prefix. So each stream records how many
tokens its state has absorbed (`absorbed`), and a forward may only continue a stream exactly where
its state stands, or start it again at position 0 (`stepping` zeroes the state). Anything else
(a prefix reused past or short of the state, a KV copy the state could not follow) marks the
stream `INVALID`, and a forward continuing it raises rather than computing from the wrong state.
The engine keeps to these rules (engine/recurrent_policy.py); this check is what makes a missed
case an error instead of a wrong answer.

**Checkpoints** (llama-server's `--ctx-checkpoints`): copies of a stream's state at a position
(`snapshot`, taken by the engine a few tokens before a prompt's end), up to `max_checkpoints` a
stream, the oldest dropped first. `trim(stream, n)` puts a stream back to n tokens: its live state
if it stands there, a checkpoint taken at n, or 0; checkpoints past n go (the stream's tokens after
n are about to be overwritten). So a prompt that shares all but the end of a slot's last prompt (the
same prompt again; a chat's next turn whose template rewrote the last answer) restarts from the
checkpoint instead of from 0.

Memory: per stream and recurrent layer, `d_conv - 1` convolution inputs and a [v_heads, head_k,
head_v] float32 matrix (Qwen3.5-0.8B: 18 layers x 1 MiB a stream), on the cache's device, made
when the engine starts (a bare layout: at its first forward); each checkpoint is one more stream's
worth, made as prompts pass their mark (not counted in a paged pool's budget). llama.cpp keeps the
same f32 states (its `llama_memory_recurrent`).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch

INVALID = -1
# The most state a step graph's capture copies to rewind (`rewinds`): Qwen3.5-0.8B's 18 MB a stream,
# 57 streams; a larger model's larger decode batches run uncaptured.
REWIND_BYTES_MAX = 1 << 30


class RecurrentState:
    def __init__(self, spec, n_streams: int, device: str | torch.device = "cpu", max_checkpoints: int = 0) -> None:
        """spec: the model's RecurrentSpec."""
        n = len(spec.recurrent_layers)
        self.conv = torch.zeros(n, n_streams, spec.d_conv - 1, spec.conv_dim, device=device)   # [L, S, d_conv-1, C]
        self.ssm = torch.zeros(n, n_streams, spec.n_v_heads, spec.head_k, spec.head_v,
                               device=device)                            # [L, S, H, dk, dv]
        self.absorbed = [0] * n_streams
        self.max_checkpoints = max_checkpoints
        # per stream: position -> (conv [L, d_conv-1, C], ssm [L, H, dk, dv]) copies, oldest first
        self.checkpoints: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] = [{} for _ in range(n_streams)]
        # model layer -> its row in conv / ssm
        self.row = {layer: j for j, layer in enumerate(spec.recurrent_layers)}

    @contextlib.contextmanager
    def stepping(self, meta) -> Iterator[None]:
        """Around a forward of the batch `meta` (AttnMeta): each sequence must continue its stream
        where the state stands, or start it at 0 (state zeroed, its checkpoints dropped: they were
        another token history's); else RuntimeError naming both counts, before anything changed.
        The sequences come from the meta's host copy (no device read). After, each state has
        absorbed its tokens; a forward that raised leaves its streams INVALID (its layers stopped
        part-way)."""
        host = meta.host
        if not host:
            raise ValueError("a recurrent forward needs the batch's sequences on the host (AttnMeta from Batch.build)")
        streams, starts = [s for s, _, _ in host], [end - n for _, n, end in host]
        for stream, start in zip(streams, starts):
            if start and self.absorbed[stream] != start:
                held = "nothing valid" if self.absorbed[stream] == INVALID else f"{self.absorbed[stream]} tokens"
                raise RuntimeError(f"stream {stream}: a recurrent model cannot continue at position {start}: "
                                   f"its state holds {held}")
        for stream in (s for s, start in zip(streams, starts) if start == 0):
            self.conv[:, stream].zero_()
            self.ssm[:, stream].zero_()
            self.absorbed[stream], self.checkpoints[stream] = 0, {}
        try:
            yield
        except BaseException:
            for stream in streams:
                self.invalidate(stream)
            raise
        for stream, _, end in host:
            self.absorbed[stream] = end

    def backup(self, streams: list[int]) -> dict:
        """The streams' states, counts and checkpoints as they are (a lab rollback's retry restores them)."""
        return {s: (self.conv[:, s].clone(), self.ssm[:, s].clone(), self.absorbed[s], dict(self.checkpoints[s]))
                for s in streams}

    def rewinds(self, n_streams: int) -> bool:
        """Whether `rewinder` may copy n streams' states: at most REWIND_BYTES_MAX (a step graph's
        capture makes that copy; a batch beyond it runs as usual, uncaptured)."""
        one = self.conv[:, 0].numel() * self.conv.element_size() + self.ssm[:, 0].numel() * self.ssm.element_size()
        return one * n_streams <= REWIND_BYTES_MAX

    def rewinder(self, streams: list[int]) -> Callable[[], None]:
        """Save the streams' states now -> what puts them back (a step graph's capture runs the
        step more than once: model/step_graph.py's `capture`)."""
        saved = self.backup(streams)
        return lambda: self.restore_backup(saved)

    def restore_backup(self, saved: dict) -> None:
        for s, (conv, ssm, absorbed, marks) in saved.items():
            self.conv[:, s].copy_(conv)
            self.ssm[:, s].copy_(ssm)
            self.absorbed[s], self.checkpoints[s] = absorbed, marks

    def copy_stream(self, src: int, dst: int, n: int) -> None:
        """A KV copy of src's first n cells to dst: the state follows when it stands exactly at n,
        and the checkpoints up to n do (they are copies: the two streams may share them)."""
        if src == dst:
            return
        if n and n == self.absorbed[src]:
            self.conv[:, dst] = self.conv[:, src]
            self.ssm[:, dst] = self.ssm[:, src]
        self.absorbed[dst] = self.absorbed[src] if n == self.absorbed[src] else (0 if n == 0 else INVALID)
        self.checkpoints[dst] = {k: snap for k, snap in self.checkpoints[src].items() if k <= n}

    def invalidate(self, stream: int) -> None:
        """KV written into the stream from elsewhere (an import): no state matches it."""
        self.absorbed[stream] = INVALID
        self.checkpoints[stream] = {}

    # -- checkpoints ------------------------------------------------------------------------------
    def snapshot(self, stream: int) -> None:
        """Keep a copy of the stream's state where it stands now (dropping the oldest past the cap)."""
        n, marks = self.absorbed[stream], self.checkpoints[stream]
        if self.max_checkpoints <= 0 or n <= 0:
            return
        marks.pop(n, None)
        marks[n] = (self.conv[:, stream].clone(), self.ssm[:, stream].clone())
        while len(marks) > self.max_checkpoints:
            marks.pop(next(iter(marks)))

    def positions(self, stream: int) -> list[int]:
        """Where the stream can be put back without recomputing: its state's position and checkpoints."""
        live = [self.absorbed[stream]] if self.absorbed[stream] > 0 else []
        return live + list(self.checkpoints[stream])

    def trim(self, stream: int, n: int) -> None:
        """The stream keeps its first n tokens: its live state (standing at n), a checkpoint at n, or
        0; anything else leaves it INVALID (a state cannot be cut back). Checkpoints past n go."""
        if n == 0:
            self.absorbed[stream] = 0
        elif n != self.absorbed[stream]:
            snap = self.checkpoints[stream].get(n)
            if snap is None:
                self.absorbed[stream] = INVALID
            else:
                self.conv[:, stream].copy_(snap[0])
                self.ssm[:, stream].copy_(snap[1])
                self.absorbed[stream] = n
        self._forget_after(stream, n)

    def _forget_after(self, stream: int, n: int) -> None:
        marks = self.checkpoints[stream]
        for k in [k for k in marks if k > n]:
            del marks[k]

    def bytes_used(self) -> int:
        """The live states and every checkpoint (two streams sharing a checkpoint count it twice)."""
        snaps = sum(c.numel() * c.element_size() + s.numel() * s.element_size()
                    for marks in self.checkpoints for c, s in marks.values())
        return self.conv.numel() * self.conv.element_size() + self.ssm.numel() * self.ssm.element_size() + snaps


def recurrent_state(cache, spec) -> RecurrentState:
    """The recurrent states kept with `cache` (a KVCache or a bare layout: `cache.recurrent`), made
    on first use for the cache's streams, with `cache.max_checkpoints` (the engine's
    --ctx-checkpoints; none for a bare layout); spec: the model's RecurrentSpec."""
    state = getattr(cache, "recurrent", None)
    if state is None:
        kv = cache.spec
        with torch.inference_mode(False):   # made in a forward: plain tensors, which the KV moves may edit
            state = cache.recurrent = RecurrentState(spec, kv.n_streams, kv.device,
                                                     getattr(cache, "max_checkpoints", 0))
    return state
