"""One step's ragged batch: several sequences, each with a chunk of new tokens at given positions.

Prefill, chunked prefill and decode are the same thing here: a sequence with `start` tokens
already in its KV stream contributes `len(tokens)` new ones (1 for decode). `Batch.build` turns the
chunks into the flat tensors one forward needs, computed once per step and shared by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from slotserver.runtime.device import upload


@dataclass(frozen=True)
class SeqChunk:
    """New tokens of one sequence: they go to `stream` at positions `start .. start+len-1`."""

    stream: int
    start: int
    tokens: list[int]
    all_logits: bool = False  # logits for every token (teacher forcing) instead of only the last
    logits: bool = True       # logits of the last token (False: a prefill chunk that samples nothing)
    # Tokens of a prompt: the attention kernel may compute their rows with its prompt formulation
    # (AMX tiles on CPUs that have them, kernels/attention_amx.c), the same floats for a prompt row
    # however the prompt is chunked, but not a decode row's. Decode and verify chunks leave it False.
    prompt: bool = False
    # LoRA adapters (model/lora.py): the sequence's scale of each adapter; () for none
    lora: tuple[float, ...] = ()


@dataclass(frozen=True)
class AttnMeta:
    """What an attention kernel needs to know about the ragged batch.

    Sequence b owns query rows `q_offsets[b] .. q_offsets[b]+q_lens[b]-1` of the flat batch and
    sees keys `0 .. kv_lens[b]-1` of its stream, causally: the query at position p sees keys <= p.
    """

    seq_streams: torch.Tensor   # [B] int64 stream of each sequence
    q_lens: torch.Tensor        # [B] int64 new tokens per sequence
    kv_lens: torch.Tensor       # [B] int64 cells valid after this step's write (= start + q_len)
    q_offsets: torch.Tensor     # [B] int64 first flat row of each sequence
    pad_index: torch.Tensor     # [B, max_q] int64 flat row of (b, j); 0 where j >= q_lens[b]
    pad_positions: torch.Tensor  # [B, max_q] int64 position of (b, j); 0 where padded
    valid_rows: torch.Tensor    # [T] int64 index into the [B*max_q] padded rows of each flat row
    max_q: int
    max_kv: int
    stream_base: int | None     # streams are base, base+1, ... in batch order: slice, don't gather
    # A mixed step (the scheduler puts decodes first): metas of the leading one-token sequences and
    # of the rest, each with rows counted from its own first row. A padded kernel runs the two
    # halves apart instead of padding every decode row to the longest prefill chunk.
    split: tuple["AttnMeta", "AttnMeta"] | None = None
    # Per-layer options (`with_layer`): a sliding window (the query at position p sees keys
    # p-window+1 .. p; 0: full causal attention), gemma2's score soft-capping (0: off) and
    # gpt-oss's attention sinks: [q_heads] float32 logits, one per query head, each joining the
    # softmax denominator of every query of its head with no value (ggml_soft_max_ext's sinks:
    # p_j = exp(s_j) / (sum_i exp(s_i) + exp(sink)); None: off). A weight of the layer, not of the
    # step: `Batch.tensors` leaves it out, a step graph keeps its pointer.
    window: int = 0
    softcap: float = 0.0
    # Per flat row: its stream and how many keys it sees (its position + 1). A kernel may run every
    # row, prefill rows included, as the one-query decode computation (kernels/attention.py does):
    # a row's result then never depends on how its prompt was batched or cached.
    row_streams: torch.Tensor | None = None   # [T] int64
    row_kv_lens: torch.Tensor | None = None   # [T] int64
    row_prompt: torch.Tensor | None = None    # [T] uint8: 1 for rows of prompt chunks; None: there are none
    sinks: torch.Tensor | None = None         # [q_heads] float32 (see window, softcap above)
    # Per sequence, on the host: (stream, new tokens, kv_len), what the tensors above hold. Why: a
    # hybrid model's recurrent states are accounted per stream in Python (runtime/recurrent_state.py);
    # reading the tensors back was device syncs in every CUDA forward.
    host: tuple[tuple[int, int, int], ...] = ()

    @property
    def n_seqs(self) -> int:
        return int(self.seq_streams.shape[0])

    def with_layer(self, window: int, softcap: float, sinks: torch.Tensor | None = None) -> "AttnMeta":
        """The same batch under a layer's window, softcap and sinks (its split halves too)."""
        if window == self.window and softcap == self.softcap and sinks is self.sinks:
            return self
        split = None if self.split is None else tuple(m.with_layer(window, softcap, sinks) for m in self.split)
        return replace(self, window=window, softcap=softcap, split=split, sinks=sinks)


def softmax_sinks(scores: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """scores [q_heads, L] or [B, q_heads, M, L] -> the softmax over L, each head's sink logit
    (`AttnMeta.sinks`) joining the denominator as one more column, dropped after: ggml_soft_max_ext
    with sinks. The attention kernels' torch formulations (references, SDPA fallbacks) share it."""
    if sinks is None:
        return scores.softmax(dim=-1)
    shape = [1] * scores.dim()
    shape[-2 if scores.dim() == 2 else -3] = -1
    col = sinks.float().view(shape).expand(*scores.shape[:-1], 1)
    return torch.cat([scores.float(), col], dim=-1).softmax(dim=-1)[..., :-1]


@dataclass(frozen=True)
class Batch:
    tokens: torch.Tensor         # [T] int64
    positions: torch.Tensor      # [T] int64
    token_streams: torch.Tensor  # [T] int64
    logits_rows: torch.Tensor    # [R] int64 flat rows whose logits are returned
    attn: AttnMeta
    # [T, adapters] float32: each row's LoRA adapter scales (model/lora.py); None when no row has one.
    # Rows of one step may differ: the deltas are computed per row.
    lora: torch.Tensor | None = None

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[0])

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the batch and of its AttnMeta (split halves too), in field order: what a
        replayed step graph copies into the tensors it was captured with."""
        return _tensors(self)

    @staticmethod
    def build(chunks: list[SeqChunk], device: str | torch.device = "cpu") -> "Batch":
        assert chunks, "empty batch"
        assert len({c.stream for c in chunks}) == len(chunks), "two chunks on one stream"
        q_lens = [len(c.tokens) for c in chunks]
        assert min(q_lens) > 0, "a chunk without tokens"
        if max(q_lens) == 1 and all(c.logits and not c.prompt for c in chunks):
            return _decode(chunks, device)
        logits_rows, total = [], 0
        for c, n in zip(chunks, q_lens):
            if c.all_logits:
                logits_rows.extend(range(total, total + n))
            elif c.logits:
                logits_rows.append(total + n - 1)
            total += n
        return Batch(
            tokens=_long([t for c in chunks for t in c.tokens], device),
            positions=_long([c.start + j for c in chunks for j in range(len(c.tokens))], device),
            token_streams=_long([c.stream for c in chunks for _ in c.tokens], device),
            logits_rows=_long(logits_rows, device),
            attn=_attn_meta(chunks, device, split=True),
            lora=_lora_rows(chunks, device),
        )


def _lora_rows(chunks: list[SeqChunk], device) -> torch.Tensor | None:
    """[T, adapters] float32, each chunk's adapter scales on each of its rows; None if no chunk has one."""
    n = max(len(c.lora) for c in chunks)
    if not any(any(c.lora) for c in chunks):
        return None
    rows = [list(c.lora) + [0.0] * (n - len(c.lora)) for c in chunks for _ in c.tokens]
    return upload(torch.tensor(rows, dtype=torch.float32), device)   # no wait for a step in flight


def _decode(chunks: list[SeqChunk], device) -> Batch:
    """A decode step's batch (one token and its logits per sequence), the same tensors as `build`'s
    general path, as rows of one int64 tensor: one allocation instead of ~15 (~0.3 ms at b=1)."""
    n = len(chunks)
    streams = [c.stream for c in chunks]
    rows = range(n)
    t = torch.tensor([[c.tokens[0] for c in chunks], [c.start for c in chunks], streams,
                      [c.start + 1 for c in chunks], list(rows), [1] * n], dtype=torch.int64)
    t = upload(t, device)   # no wait for an overlapped step in flight (--async-steps)
    tokens, positions, streams_t, kv_lens, index, ones = t                     # each [n]
    base = streams[0] if streams == list(range(streams[0], streams[0] + n)) else None
    meta = AttnMeta(seq_streams=streams_t, q_lens=ones, kv_lens=kv_lens, q_offsets=index,
                    pad_index=index.view(n, 1), pad_positions=positions.view(n, 1), valid_rows=index, max_q=1,
                    max_kv=max(c.start + 1 for c in chunks), stream_base=base, row_streams=streams_t,
                    row_kv_lens=kv_lens, host=tuple((c.stream, 1, c.start + 1) for c in chunks))
    return Batch(tokens=tokens, positions=positions, token_streams=streams_t, logits_rows=index, attn=meta,
                 lora=_lora_rows(chunks, device))


def _attn_meta(chunks: list[SeqChunk], device, split: bool = False) -> AttnMeta:
    n, q_lens = len(chunks), [len(c.tokens) for c in chunks]
    max_q, offsets, valid_rows, total = max(q_lens), [], [], 0
    for b, q in enumerate(q_lens):
        offsets.append(total)
        valid_rows.extend(range(b * max_q, b * max_q + q))
        total += q
    j = torch.arange(max_q).unsqueeze(0)                      # [1, max_q]
    valid = j < torch.tensor(q_lens).unsqueeze(1)            # [B, max_q]
    pad_index = torch.where(valid, torch.tensor(offsets).unsqueeze(1) + j, 0)
    pad_positions = torch.where(valid, torch.tensor([c.start for c in chunks]).unsqueeze(1) + j, 0)
    kv_lens = [c.start + q for c, q in zip(chunks, q_lens)]
    streams = [c.stream for c in chunks]
    base = streams[0] if streams == list(range(streams[0], streams[0] + n)) else None
    n_decode = next((b for b, q in enumerate(q_lens) if q > 1), n)
    halves = None
    if split and 0 < n_decode < n:
        halves = (_attn_meta(chunks[:n_decode], device), _attn_meta(chunks[n_decode:], device))
    return AttnMeta(
        seq_streams=_long(streams, device),
        q_lens=_long(q_lens, device),
        kv_lens=_long(kv_lens, device),
        q_offsets=_long(offsets, device),
        pad_index=pad_index.to(device),
        pad_positions=pad_positions.to(device),
        valid_rows=_long(valid_rows, device),
        max_q=max_q,
        max_kv=max(kv_lens),
        stream_base=base,
        split=halves,
        row_streams=_long([c.stream for c in chunks for _ in c.tokens], device),
        row_kv_lens=_long([c.start + j + 1 for c in chunks for j in range(len(c.tokens))], device),
        row_prompt=_prompt_rows(chunks, device),
        host=tuple(zip(streams, q_lens, kv_lens)),
    )


def _prompt_rows(chunks: list[SeqChunk], device) -> torch.Tensor | None:
    """[T] uint8, 1 for the rows of prompt chunks; None when there are none (the kernels' test)."""
    if not any(c.prompt for c in chunks):
        return None
    return torch.tensor([c.prompt for c in chunks for _ in c.tokens], dtype=torch.uint8, device=device)


def _tensors(obj) -> list[torch.Tensor]:
    out = []
    for f in fields(obj):
        v = getattr(obj, f.name)
        if f.name == "sinks":   # a layer's weight (with_layer), never a step's input
            continue
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, AttnMeta):
            out += _tensors(v)
        elif isinstance(v, tuple) and f.name == "split":
            out += [t for m in v for t in _tensors(m)]
    return out


def _long(values: list[int], device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)
