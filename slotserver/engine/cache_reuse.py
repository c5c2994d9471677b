"""`--cache-reuse N` / the request field `n_cache_reuse`: llama-server's chunk reuse at admission.

A new prompt shares a prefix with the slot's cached tokens; past it, llama-server looks for runs of
at least N cached tokens that match the prompt further on, and moves their KV into place instead
of computing those tokens again (tools/server/server-context.cpp, "reuse chunks from the cached
prompt by shifting their KV cache in the new position"). Its loop, followed to the letter:

    head_c = head_p = n_past                       # after the common prefix
    while head_c < len(cached) and head_p < len(prompt):
        n = length of the match of cached[head_c:] with prompt[head_p:]
        if n >= N: move cells [head_c, head_c + n) to [head_p, ...); head_c += n; head_p += n
        else:      head_c += 1                     # skip one cached token

So the prompt's reused part stays one prefix (`head_p` only moves over reused tokens), and every
chunk moves down (`head_p <= head_c`). The move is a `KVShift` (engine/context_shift.py) that the
engine applies before the forward (engine/kv_shift.py: cells moved, K re-rotated by the position
delta with the model's own RoPE); the reused tokens count as cached (`n_cached`, `cache_n`), as
llama-server's `n_prompt_cached = n_past`. At least one prompt token is still computed (the
scheduler's `num_prompt - 1` cap, llama-server's TAG_PROMPT_LOGITS).

Pure bookkeeping, no torch: the scheduler calls `reuse` inside its admission, after the prompt
cache's hooks may have put another prefix into the slot (engine/prompt_cache.py).
"""

from __future__ import annotations

from typing import Sequence as Tokens

from slotserver.engine.config import EngineConfig
from slotserver.engine.context_shift import KVShift, Span
from slotserver.engine.sequence import Sequence
from slotserver.engine.slots import common_prefix


def find_chunks(cached: Tokens[int], prompt: Tokens[int], n_past: int, n_min: int) -> list[Span]:
    """llama-server's search: chunks of >= n_min cached tokens (n_min >= 1) matching the prompt
    from `n_past` on, each as the Span that moves it into place."""
    assert n_min >= 1
    spans, head_c, head_p = [], n_past, n_past
    while head_c < len(cached) and head_p < len(prompt):
        n = 0
        while head_c + n < len(cached) and head_p + n < len(prompt) and cached[head_c + n] == prompt[head_p + n]:
            n += 1
        if n >= n_min:
            spans.append(Span(head_c, head_p, n))
            head_c, head_p = head_c + n, head_p + n
        else:
            head_c += 1
    return spans


def min_chunk(seq: Sequence, config: EngineConfig) -> int:
    """The least chunk this request reuses: its `n_cache_reuse`, else --cache-reuse (0: no chunk reuse)."""
    n = seq.request.n_cache_reuse
    return config.cache_reuse if n is None else n


def reuse(cached: list[int], seq: Sequence, n_min: int, stream: int) -> tuple[int, KVShift | None]:
    """Tokens of `seq` whose KV the slot (holding `cached` on `stream`) can give it, and the shift
    that puts the reused chunks in place (None: only the common prefix, nothing moves).
    n_min: the least chunk, 0 for no chunk reuse. The caller caps the count to leave one token."""
    if not seq.request.cache_prompt:
        return 0, None
    n_past = common_prefix(cached, seq.tokens)
    spans = find_chunks(cached, seq.tokens, n_past, n_min) if n_min > 0 else []
    if not spans:
        return n_past, None
    n = n_past + sum(s.n for s in spans)
    return n, KVShift(stream, tuple(spans), n)
