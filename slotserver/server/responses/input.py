"""The Responses API's `input` and `instructions` -> the chat messages the chat template renders.

The conversion is llama-server's (tools/server/server-chat.cpp
`server_chat_convert_responses_to_chatcmpl`), so one history renders the same prompt on both:
- `instructions` becomes a first system message; a string `input` one user message.
- Message items (role user / system / developer / assistant; `type` "message" optional, content a
  string or parts) become chat messages: `input_text` and `output_text` parts become text parts,
  a `refusal` part the text of the refusal (it is what the assistant said).
- `function_call` items become `tool_calls` of an assistant message, `function_call_output` items
  `tool` messages with their `tool_call_id`; `reasoning` items the `reasoning_content` of an
  assistant message (the text of their `reasoning_text` content, else of their summary: the
  stateless way to hand back a previous answer's thinking).
- An assistant item that follows an assistant message (reasoning, text, calls of one turn) joins
  it, as llama-server merges them, so one turn stays one message.
Unlike llama-server, an assistant message item without `type` is accepted (OpenAI's "easy input
message"). Whatever cannot be represented is a 400 naming the item: images and files (no
multimodal model), `item_reference` (nothing is stored), and the hosted tools' items.
"""

from __future__ import annotations

from typing import Any

from slotserver.server.errors import bad_request

INPUT_ROLES = ("user", "system", "developer")
TEXT_PARTS = ("input_text", "output_text")


def _text_parts(where: str, content: Any) -> list[dict]:
    """A message item's content -> chat text parts; a string is one part."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad_request(f"'{where}.content' must be a string or a list of content parts")
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        key = "refusal" if kind == "refusal" else "text"
        if kind in ("input_image", "input_file", "input_audio"):
            raise bad_request(f"'{where}.content[{j}]': {kind} is not supported: only text is, "
                              "this server runs no multimodal model")
        if kind not in TEXT_PARTS and kind != "refusal":
            raise bad_request(f"'{where}.content[{j}].type' must be one of 'input_text', 'output_text' "
                              f"or 'refusal', got {kind!r}")
        if not isinstance(part.get(key), str):
            raise bad_request(f"'{where}.content[{j}].{key}' must be a string")
        parts.append({"type": "text", "text": part[key]})
    return parts


def _reasoning_text(where: str, item: dict) -> str:
    """A reasoning item's text: its reasoning_text content, else its summary texts."""
    for key in ("content", "summary"):
        parts = item.get(key) or []
        if not isinstance(parts, list) or not all(isinstance(p, dict) and isinstance(p.get("text"), str)
                                                   for p in parts):
            raise bad_request(f"'{where}.{key}' must be a list of {{type, text}} parts")
        if parts:
            return "\n".join(p["text"] for p in parts)
    return ""


def _call_output(where: str, output: Any) -> str | list[dict]:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return _text_parts(where, output) if output else ""
    raise bad_request(f"'{where}.output' must be a string or a list of input_text parts")


def _string_field(where: str, item: dict, name: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise bad_request(f"'{where}.{name}' must be a string")
    return value


class _History:
    """The chat messages built so far, with llama-server's merge of one assistant turn."""

    def __init__(self) -> None:
        self.messages: list[dict] = []

    def assistant(self) -> dict:
        """The assistant message to add to: the last one, or a new one."""
        if not self.messages or self.messages[-1].get("role") != "assistant":
            self.messages.append({"role": "assistant", "content": []})
        return self.messages[-1]

    def add(self, where: str, item: Any) -> None:
        if not isinstance(item, dict):
            raise bad_request(f"'{where}' must be an object")
        kind, role = item.get("type"), item.get("role")
        if kind in (None, "message") and role in INPUT_ROLES:
            self.messages.append({"role": role, "content": _text_parts(where, item.get("content"))})
        elif kind in (None, "message") and role == "assistant":
            self._assistant_text(where, item)
        elif kind == "function_call":
            call = {"id": _string_field(where, item, "call_id"), "type": "function",
                    "function": {"name": _string_field(where, item, "name"),
                                 "arguments": _string_field(where, item, "arguments")}}
            self.assistant().setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            self.messages.append({"role": "tool", "tool_call_id": _string_field(where, item, "call_id"),
                                  "content": _call_output(where, item.get("output"))})
        elif kind == "reasoning":
            self._reasoning(where, item)
        elif kind == "item_reference":
            raise bad_request(f"'{where}': item references are not supported: this server stores no "
                              "items; send the item itself")
        else:
            raise bad_request(f"'{where}': cannot use an item of type {kind!r} (role {role!r}): "
                              "message, function_call, function_call_output and reasoning items are supported")

    def _assistant_text(self, where: str, item: dict) -> None:
        message = self.assistant()
        if "content" in item:
            message["content"] = [*message["content"], *_text_parts(where, item["content"])]

    def _reasoning(self, where: str, item: dict) -> None:
        text = _reasoning_text(where, item)
        if text:
            message = self.assistant()
            before = message.get("reasoning_content")
            message["reasoning_content"] = f"{before}\n{text}" if before else text


def input_messages(body: dict) -> list[dict]:
    """`instructions` and `input` -> chat messages; a 400 naming what cannot be converted."""
    if "input" not in body or body["input"] is None:
        raise bad_request("'input' is required")
    history = _History()
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad_request("'instructions' must be a string")
        history.messages.append({"role": "system", "content": instructions})
    value = body["input"]
    if isinstance(value, str):
        history.messages.append({"role": "user", "content": value})
    elif isinstance(value, list):
        for i, item in enumerate(value):
            history.add(f"input[{i}]", item)
    else:
        raise bad_request("'input' must be a string or a list of input items")
    if not history.messages:
        raise bad_request("'input' is empty and there are no 'instructions': nothing to answer")
    return [_plain_content(m) for m in history.messages]


def _plain_content(message: dict) -> dict:
    """An assistant message with no text gets "" (with calls: what templates expect next to them)."""
    if message.get("role") == "assistant" and message.get("content") == []:
        return {**message, "content": ""}
    return message
