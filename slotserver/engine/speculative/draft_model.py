"""draft-simple: a smaller model of the same vocabulary guesses the next tokens greedily
(llama.cpp's `common_speculative_impl_draft_simple`, common/speculative.cpp).

The draft model has its own KV cache, one stream per slot, and remembers which tokens each stream
holds. Before drafting, a stream catches up with its sequence (the common prefix is kept: a
rejected draft's cells are simply written over). Then every drafting sequence advances one token
per batched forward: the draft's argmax, kept while its probability among the top 10 (llama.cpp's
draft sampler is top-k 10) is at least `p_min`, up to `n_max` tokens; a draft shorter than `n_min`
is dropped, as there.

Why slots and not the target's streams: defragmentation moves the target's streams between steps;
the draft model's cache follows slots, so no move ever has to be mirrored here.
"""

from __future__ import annotations

import torch

from slotserver.engine.kv_cache import KVCache
from slotserver.engine.slots import common_prefix
from slotserver.engine.speculative.drafter import DraftRequest
from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.runtime.kv_spec import KVSpec
from slotserver.errors import ConfigError

CATCH_UP_CHUNK = 512   # tokens of one catch-up forward (a long prompt is prefilled in pieces)
TOP_K = 10
VOCAB_SIZE_SLACK = 128   # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE


class VocabularyMismatch(ConfigError):
    pass


def check_vocabulary(target, draft) -> None:
    """Refuse a draft whose token ids mean other texts than the target's (llama.cpp's
    `common_speculative_are_compatible`: same tokenizer kind and BOS/EOS, sizes within 128, the same
    texts from id 5 on): its guesses would be other tokens."""
    t, d = target.tokenizer, draft.tokenizer
    n = min(t.vocab_size, d.vocab_size)
    why = ("its tokenizer kind" if t.model != d.model else "its BOS/EOS tokens" if (t.bos_id, t.eos_id) != (d.bos_id, d.eos_id)
           else "its size" if abs(t.vocab_size - d.vocab_size) > VOCAB_SIZE_SLACK
           else next((f"token {i}" for i in range(5, n) if t.piece(i) != d.piece(i)), None))
    if why is not None:
        raise VocabularyMismatch(f"the draft model's vocabulary is not the target's ({why} differs: "
                                 f"{d.vocab_size} vs {t.vocab_size} tokens); speculative decoding needs the same tokenizer")


class DraftModel:
    name = "draft-simple"

    def __init__(self, bundle, n_slots: int, n_cells: int, n_max: int, n_min: int, p_min: float,
                 kv_dtype: torch.dtype | None = None) -> None:
        """kv_dtype: the draft cache's element type (the engine passes the target's: -ctk/-ctv)."""
        s, m = bundle.model.spec, bundle.model
        spec = KVSpec(s.n_kv_layers, n_slots, n_cells, s.n_kv_heads, s.head_dim, kv_dtype or m.dtype, device=m.device)
        self.model, self.device = m, m.device
        self.cache = KVCache.create(bundle.config.layout, spec, bundle.config.layouts_dir)
        self.held: list[list[int]] = [[] for _ in range(n_slots)]   # tokens whose KV each stream holds
        self.n_max, self.n_min, self.p_min = n_max, n_min, p_min

    def propose(self, requests: list[DraftRequest]) -> list[list[int]]:
        drafts: list[list[int]] = [[] for _ in requests]
        live = [i for i, r in enumerate(requests) if min(r.n_max, self.n_max) > 0]
        if not live:
            return drafts
        last = {i: self._catch_up(requests[i]) for i in live}      # request -> its last token's position
        feed = {i: requests[i].tokens[-1] for i in live}             # token to run next, per request
        while live:
            chunks = [SeqChunk(requests[i].slot_id, last[i], [feed[i]]) for i in live]
            logits = self.model.forward(Batch.build(chunks, self.device), self.cache)   # [len(live), vocab]
            token, prob = _top(logits)
            still = []
            for row, i in enumerate(live):
                self.held[requests[i].slot_id].append(feed[i])   # its K/V was just written at last[i]
                if prob[row] < (self.p_min if requests[i].p_min is None else requests[i].p_min):
                    continue
                drafts[i].append(token[row])
                if len(drafts[i]) < min(requests[i].n_max, self.n_max):
                    feed[i], last[i] = token[row], last[i] + 1
                    still.append(i)
            live = still
        return [d if len(d) >= (self.n_min if r.n_min is None else r.n_min) else [] for d, r in zip(drafts, requests)]

    def _catch_up(self, r: DraftRequest) -> int:
        """Compute the draft KV of r.tokens[:-1] not yet in its stream; -> the last token's position.
        Prompt tokens as prompt rows, generated ones as decode rows compute them (pieces never
        straddle the prompt's end): the draft's KV is then what the target's is for a same model."""
        held, target = self.held[r.slot_id], r.tokens[:-1]
        start = common_prefix(held, target)
        while start < len(target):
            end = min(start + CATCH_UP_CHUNK, len(target), *([r.prompt_end] if start < r.prompt_end else []))
            chunk = SeqChunk(r.slot_id, start, target[start:end], logits=False, prompt=end <= r.prompt_end)
            self.model.forward(Batch.build([chunk], self.device), self.cache)
            start = end
        self.held[r.slot_id] = list(target)
        return len(target)

    def accepted(self, seq_id: int, n_drafted: int, n_accepted: int) -> None:
        """Nothing to learn: the next catch-up keeps the common prefix."""

    def forget(self, seq_id: int) -> None:
        """The stream stays as it is: the slot's next request may share its prefix."""


def _top(logits: torch.Tensor) -> tuple[list[int], list[float]]:
    """Per row: the argmax and its probability among the row's top 10 (llama.cpp's draft sampler)."""
    top = logits.float().topk(min(TOP_K, logits.shape[1]), dim=1)           # values [rows, 10], sorted
    prob = torch.softmax(top.values, dim=1)[:, 0]                            # [rows]
    return top.indices[:, 0].tolist(), prob.tolist()
