"""OpenAI chat messages -> the messages a chat template sees, reshaped as llama-server does.

llama-server (common/chat.cpp: `common_chat_msgs_parse_oaicompat`, `to_json_oaicompat`,
`messages_inp_normalizer` and the `workaround` namespace) does not hand the request's messages to
the template as they came. What it does, and so what we do:

- `content` may be a string, null (read as ""), or a list of parts. Only text parts exist here:
  an image, audio or video part is refused by name (no multimodal model is loaded), any other
  type too. Parts keep only `type` and `text`.
- The template's capabilities (template_caps.py) decide the content's form: a template that takes
  only strings gets the parts joined with newlines; one that takes only parts gets a string as one
  text part; one that takes both gets what was sent.
- `developer` becomes `system`, except for GPT-OSS templates (they have their own developer turn).
- A template that ignores or refuses the system role gets the first system message merged into
  the next message ("system\\nuser"), or dropped when it is the only message.

Every problem is a `ChatTemplateError` naming the message (an HTTP 400).
"""

from __future__ import annotations

import json
from typing import Any

from slotserver.errors import ChatTemplateError
from slotserver.model.text.template_caps import TemplateCaps

MEDIA_PARTS = {"image_url": "image", "input_audio": "audio", "input_video": "video", "video_url": "video"}


def _part_text(where: str, part: Any) -> str:
    if not isinstance(part, dict) or "type" not in part:
        raise ChatTemplateError(f"{where} must be an object with a 'type', got {str(part)[:60]}")
    kind = part["type"]
    if kind in MEDIA_PARTS:
        raise ChatTemplateError(f"{where}: {MEDIA_PARTS[kind]} input (type {kind!r}) is not supported: "
                                "only text parts are, this server runs no multimodal model")
    if kind != "text":
        raise ChatTemplateError(f"{where}: unsupported content part type {kind!r}; only {{type: 'text'}} "
                                "parts are supported")
    if not isinstance(part.get("text"), str):
        raise ChatTemplateError(f"{where}.text must be a string")
    return part["text"]


def _content(index: int, content: Any) -> str | list[dict[str, str]]:
    """A message's content as llama.cpp keeps it: a string, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ChatTemplateError(f"messages[{index}].content must be a string or a list of text parts, "
                                f"got {type(content).__name__}")
    parts = [{"type": "text", "text": _part_text(f"messages[{index}].content[{j}]", p)}
             for j, p in enumerate(content)]
    return parts or ""


def join_parts(parts: list[dict[str, str]]) -> str:
    """llama.cpp's `concat_content_parts`: a newline between parts once some text is there."""
    text = ""
    for part in parts:
        text += ("\n" if text else "") + part["text"]
    return text


def parse_messages(messages: Any) -> list[dict[str, Any]]:
    """Validated copies of the request's messages, content as a string or text parts. An empty list
    is accepted, as llama-server accepts it (the template's generation prompt alone; llama.cpp's
    test_compat_anthropic checks it on /v1/messages)."""
    if not isinstance(messages, list):
        raise ChatTemplateError("messages must be a list of {role, content} objects")
    result = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ChatTemplateError(f"messages[{i}] must be an object, got {type(message).__name__}")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise ChatTemplateError(f"messages[{i}].role must be a non-empty string")
        if "content" not in message and not (role == "assistant" and "tool_calls" in message):
            raise ChatTemplateError(f"messages[{i}] has no content")
        result.append({**message, "content": _content(i, message.get("content"))})
    return result


def _fit_content(content: str | list, caps: TemplateCaps) -> str | list:
    only_string = caps.supports_string_content and not caps.supports_typed_content
    only_typed = caps.supports_typed_content and not caps.supports_string_content
    if only_string and isinstance(content, list):
        return join_parts(content)
    if only_typed and isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content


def _as_text(content: str | list) -> str:
    return content if isinstance(content, str) else join_parts(content)


def _merge_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """llama.cpp's `system_message_not_supported`: the first system message joins the next one."""
    if not messages or messages[0]["role"] != "system":
        return messages
    if len(messages) == 1:
        return []
    first, second = messages[0], messages[1]
    merged = {**second, "content": _as_text(first["content"]) + "\n" + _as_text(second["content"])}
    return [merged, *messages[2:]]


def fit_messages(messages: Any, caps: TemplateCaps, source: str) -> list[dict[str, Any]]:
    """The messages the template renders: parsed, content in the form it takes, roles it knows."""
    fitted = [{**m, "content": _fit_content(m["content"], caps)} for m in parse_messages(messages)]
    if "<|channel|>" not in source:   # GPT-OSS renders developer messages itself
        fitted = [{**m, "role": "system"} if m["role"] == "developer" else m for m in fitted]
    if not caps.supports_system_role:
        fitted = _merge_system(fitted)
    if caps.supports_object_arguments:
        fitted = [_object_arguments(m) if m.get("tool_calls") else m for m in fitted]
    return fitted


def _object_arguments(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message whose calls' JSON-string `arguments` are decoded into objects, for a
    template that iterates them (llama.cpp's func_args_not_string); a string that is no JSON stays.
    The server's native tool path (server/tools/prompt.py `arguments`) has decoded and checked them
    already (a 400 for one that is no JSON): this serves `ChatTemplate.render` called directly."""
    calls = message["tool_calls"]
    if not isinstance(calls, list):
        return message
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
            try:
                call = {**call, "function": {**fn, "arguments": json.loads(fn["arguments"])}}
            except json.JSONDecodeError:
                pass
        out.append(call)
    return {**message, "tool_calls": out}
