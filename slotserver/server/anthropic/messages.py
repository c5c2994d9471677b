"""Anthropic's `system` and `messages` -> the OpenAI chat messages the template renderer takes.

The reference is llama-server's converter (tools/server/server-chat.cpp
`server_chat_convert_anthropic_to_oai`), so a conversation renders to the same prompt there and
here:
- `system`: a string, or text blocks concatenated as they are (no separator), one system message.
  Claude Code's `x-anthropic-billing-header: ...; cch=XXXXX;` stamp changes on every request; its
  five `cch` characters become `fffff` so the prompt's prefix stays cacheable (llama.cpp PR 21793).
- `text` blocks stay content parts; `thinking` blocks of an assistant turn are concatenated into
  `reasoning_content` (templates with a reasoning block render it; others never read it);
  `tool_use` blocks become `tool_calls` (input as a JSON string); each `tool_result` block becomes
  a `tool` message answering its `tool_use_id`, its content a string or text blocks concatenated.
  `is_error` is accepted and, as in llama-server, the result is rendered like any other.

Where llama-server silently drops what it cannot render, this is a 400 naming the block:
`redacted_thinking` (only Anthropic can read it), unknown block types, unknown keys. Image and
document blocks answer as llama-server does, a 500 saying "image input is not supported" (no
multimodal model is loaded; llama.cpp's test_compat_anthropic checks that status and words; an
SDK retries a 5xx twice before raising it). An empty `messages` list is accepted, as llama-server
accepts it: the prompt is the system message and the template's generation prompt (Anthropic's own
API refuses it). Two deliberate differences: a user turn holding text and `tool_result`
blocks becomes messages in block order (llama-server puts the text first, which separates the
results from the calls they answer); and a final assistant turn (a prefill, which the answer
continues) gets its text blocks joined into one string, as the continuation needs.
`cache_control` is accepted everywhere: the server reuses cached prompt prefixes by itself.
"""

from __future__ import annotations

import json
from typing import Any

from slotserver.model.text.chat_messages import join_parts
from slotserver.server.errors import ApiError, bad_request

ROLES = ("user", "assistant")
TEXT_KEYS = frozenset({"type", "text", "cache_control", "citations"})
MEDIA = {"image": "image", "document": "document", "search_result": "search result"}
BILLING, CCH = "x-anthropic-billing-header:", "cch="


def _check_keys(block: dict, allowed: frozenset[str] | set[str], where: str) -> None:
    for key in block:
        if key not in allowed and block[key] is not None:
            raise bad_request(f"'{where}.{key}' is not supported")


def _str(value: Any, where: str, empty: bool = True) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise bad_request(f"'{where}' must be a {'' if empty else 'non-empty '}string")
    return value


def refuse_media(kind: str, where: str):
    return ApiError(500, f"'{where}': {MEDIA[kind]} input is not supported: this server runs no multimodal "
                    "model (only text blocks are)")   # llama-server's status for it (module docstring)


def text_block(block: Any, where: str) -> str:
    """A `{"type": "text", "text": ...}` block's text; citations are only accepted empty."""
    if not isinstance(block, dict) or block.get("type") != "text":
        kind = block.get("type") if isinstance(block, dict) else None
        if kind in MEDIA:
            raise refuse_media(kind, where)
        raise bad_request(f"'{where}' must be a text block {{\"type\": \"text\", \"text\": ...}}")
    _check_keys(block, TEXT_KEYS, where)
    if block.get("citations") not in (None, []):
        raise bad_request(f"'{where}.citations' is not supported")
    return _str(block.get("text"), f"{where}.text")


def normalize_billing(text: str) -> str:
    """llama-server's `normalize_anthropic_billing_header`: `cch=` + 5 characters + `;` -> fffff."""
    if not text.startswith(BILLING):
        return text
    i = text.find(CCH, len(BILLING))
    at = i + len(CCH)
    if i < 0 or at + 5 >= len(text) or text[at + 5] != ";":
        return text
    return text[:at] + "fffff" + text[at + 5:]


def system_message(value: Any) -> dict | None:
    """`system` -> one system message (None when absent)."""
    if value is None:
        return None
    if isinstance(value, str):
        return {"role": "system", "content": normalize_billing(value)}
    if not isinstance(value, list):
        raise bad_request("'system' must be a string or a list of text blocks")
    text = "".join(normalize_billing(text_block(b, f"system[{j}]")) for j, b in enumerate(value))
    return {"role": "system", "content": text}


def _tool_result(block: dict, where: str) -> dict:
    _check_keys(block, {"type", "tool_use_id", "content", "is_error", "cache_control"}, where)
    if block.get("is_error") is not None and not isinstance(block["is_error"], bool):
        raise bad_request(f"'{where}.is_error' must be true or false")
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "".join(text_block(c, f"{where}.content[{k}]") for k, c in enumerate(content))
    else:
        raise bad_request(f"'{where}.content' must be a string or a list of text blocks")
    return {"role": "tool", "tool_call_id": _str(block.get("tool_use_id"), f"{where}.tool_use_id", False),
            "content": text}


def _tool_use(block: dict, where: str) -> dict:
    _check_keys(block, {"type", "id", "name", "input", "cache_control"}, where)
    args = block.get("input", {})
    if not isinstance(args, dict):
        raise bad_request(f"'{where}.input' must be an object")
    return {"id": _str(block.get("id"), f"{where}.id", False), "type": "function",
            "function": {"name": _str(block.get("name"), f"{where}.name", False),
                         "arguments": json.dumps(args, ensure_ascii=False)}}


class _Turn:
    """One Anthropic message being converted: the messages it became so far and the pending one."""

    def __init__(self, role: str) -> None:
        self.role, self.out = role, []
        self.parts: list[dict] = []
        self.calls: list[dict] = []
        self.reasoning = ""

    def block(self, block: Any, where: str) -> None:
        kind = block.get("type") if isinstance(block, dict) else None
        own = {"thinking": "assistant", "tool_use": "assistant", "tool_result": "user"}
        if kind in own and own[kind] != self.role:
            raise bad_request(f"'{where}': a {kind} block belongs in a{'n' if own[kind] == 'assistant' else ''} "
                              f"{own[kind]} message")
        if kind == "thinking":
            _check_keys(block, {"type", "thinking", "signature"}, where)
            self.reasoning += _str(block.get("thinking"), f"{where}.thinking")
        elif kind == "tool_use":
            self.calls.append(_tool_use(block, where))
        elif kind == "tool_result":
            self.flush()
            self.out.append(_tool_result(block, where))
        elif kind in ("text", *MEDIA) or not isinstance(kind, str):
            self.parts.append({"type": "text", "text": text_block(block, where)})
        elif kind == "redacted_thinking":
            raise bad_request(f"'{where}': redacted_thinking blocks are not supported (only Anthropic can read them)")
        else:
            raise bad_request(f"'{where}': content block type {kind!r} is not supported")

    def flush(self, final: bool = False) -> None:
        """The pending content as a message (a tool result or the turn's end closes it)."""
        if not (self.parts or self.calls or self.reasoning):
            return
        content: str | list = self.parts or ""
        if final and self.role == "assistant" and self.parts and not self.calls:
            content = join_parts(self.parts)   # a prefill: _continuation reads it as a string
        message: dict[str, Any] = {"role": self.role, "content": content}
        if self.calls:
            message["tool_calls"] = self.calls
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        self.out.append(message)
        self.parts, self.calls, self.reasoning = [], [], ""


def convert_message(i: int, message: Any, last: bool) -> list[dict]:
    """messages[i] -> its OpenAI messages (a user turn with tool results may give several)."""
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise bad_request(f"'{where}' must be an object with 'role' and 'content'")
    _check_keys(message, {"role", "content"}, where)
    role = message.get("role")
    if role not in ROLES:
        raise bad_request(f"'{where}.role' must be \"user\" or \"assistant\", got {json.dumps(role)[:40]}")
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise bad_request(f"'{where}.content' must be a string or a list of content blocks")
    turn = _Turn(role)
    for j, block in enumerate(content):
        turn.block(block, f"{where}.content[{j}]")
    turn.flush(final=last)
    return turn.out or [{"role": role, "content": ""}]


def convert_messages(system: Any, messages: Any) -> list[dict]:
    """`system` and `messages` -> the OpenAI chat messages, in order."""
    if not isinstance(messages, list):   # empty: accepted, as llama-server does (module docstring)
        raise bad_request("'messages' must be a list of {role, content} objects")
    out = [m for m in [system_message(system)] if m is not None]
    for i, message in enumerate(messages):
        out.extend(convert_message(i, message, i == len(messages) - 1))
    return out
