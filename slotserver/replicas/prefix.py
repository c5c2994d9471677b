"""The routing key of a request: its prompt as one canonical string, cut into chained block hashes.

Why bytes of text, not tokens: the router fronts any slotserver or llama-server and holds no
tokenizer. What the replicas reuse is a common *token* prefix; two requests whose canonical texts
share their first k blocks share (up to the last partial token) the same rendered prompt prefix,
because chat templates render messages in order. So blocks of the UTF-8 text are a faithful,
model-free proxy. Blocks are small (64 bytes by default: 64 ASCII characters, ~16 tokens) because
the match is only as fine as a block: a conversation's first turn is often shorter than 256
characters, and its second turn must still find it.

Why chained hashes (block i's hash covers blocks 0..i, as vLLM's prefix-cache keys): looking up
block i's hash then means "the whole prefix up to block i is the same", with one dictionary probe.

The canonical text puts the fields in the order a chat template renders them (tools and system
first, then the messages in order), each message as sorted-key JSON on its own line, so turn N+1's
text starts with turn N's text exactly (its history is turn N's messages plus the answer).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

# the prompt-bearing fields of the APIs the replicas speak, in rendering order: tools and system
# text come before the messages in every chat template; `input`/`prompt`/`content` are the prompts
# of the Responses, embeddings, /completion and /tokenize requests; infill's extra files come first
KEY_FIELDS = ("tools", "system", "instructions", "input_extra", "messages", "input", "prompt", "content",
              "input_prefix")


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def canonical_text(body: Any) -> str:
    """The request's prompt as one string ("" when the body has none, e.g. GET or /props)."""
    if not isinstance(body, dict):
        return ""
    parts = []
    for name in KEY_FIELDS:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, list) and name in ("messages", "input", "input_extra"):
            # one line per message: turn N's text is a prefix of turn N+1's
            parts.extend(f"{name}:{_text(item)}\n" for item in value)
        else:
            parts.append(f"{name}:{_text(value)}\n")
    return "".join(parts)


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def block_hashes(text: str, block_bytes: int) -> list[bytes]:
    """Chained hashes of the UTF-8 text's full blocks: hashes[i] identifies its first (i + 1) * block_bytes bytes.

    A trailing partial block is left out: the next turn's text extends it, so it would never match."""
    out: list[bytes] = []
    prev = b""
    data = text.encode("utf-8", "surrogatepass")
    step = block_bytes   # a block boundary inside a multi-byte character is harmless: both sides hash the same bytes
    for end in range(step, len(data) + 1, step):
        prev = _digest(prev + data[end - step:end])
        out.append(prev)
    return out


@dataclass(frozen=True)
class PromptKey:
    """What the policy routes on. `whole` identifies the exact text (an identical request sent
    again); `lead` is the consistent hash's key: the first `hash_blocks` blocks, or the whole text
    when it is shorter (a short first turn still lands somewhere stable)."""
    blocks: list[bytes]
    whole: bytes
    lead: bytes

    @classmethod
    def of(cls, text: str, block_bytes: int, hash_blocks: int) -> "PromptKey | None":
        if not text:
            return None
        blocks = block_hashes(text, block_bytes)
        whole = _digest(b"whole:" + text.encode("utf-8", "surrogatepass"))
        return cls(blocks, whole, blocks[hash_blocks - 1] if len(blocks) >= hash_blocks else whole)
