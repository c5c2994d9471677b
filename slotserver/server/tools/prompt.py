"""Chat messages with tools -> the prompt, through the model's template or the fallback prompt.

A template that renders the request's call format itself (formats.py: Llama 3.x, Mistral
Nemo, or Hermes for Qwen 2.5 and any other template that mentions `tools`) gets the tools in its
Jinja context and the history as llama-server hands it over (its `workaround` namespace): call
arguments as objects (what those templates `tojson`), null content as "" next to calls, no empty
`tool_calls`; gpt-oss's (harmony) gets an assistant message's `reasoning_content` as its
`thinking`, as llama.cpp hands it over. Mistral Nemo's template refuses any call id but 9 letters
or digits, so other ids (OpenAI's `call_...`) are mapped to such ids, the same one for a call and
its result.
Any other template gets the fallback prompt (fallback.py).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from slotserver.model.text.chat_template import ChatTemplate, ChatTemplateError
from slotserver.server.errors import bad_request
from slotserver.server.tools.fallback import arguments, fallback_messages, text_of
from slotserver.server.tools.formats import HARMONY, ID_CHARS, MISTRAL, MISTRAL_ID, choose_format, native_format
from slotserver.server.tools.request import ToolConfig

NEMO_ID = re.compile(MISTRAL_ID)


def nemo_id(call_id: Any) -> Any:
    """A 9-character id for Mistral Nemo's template, derived from the given one (kept when it
    already fits), so a call and the `tool` message answering it still match."""
    if not isinstance(call_id, str) or NEMO_ID.fullmatch(call_id):
        return call_id
    n = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    return "".join(ID_CHARS[(n // 62 ** k) % 62] for k in range(9))


def _native_message(m: Any, fmt: str) -> Any:
    if not isinstance(m, dict):
        return m
    if "tool_calls" in m and not m["tool_calls"]:
        m = {k: v for k, v in m.items() if k != "tool_calls"}
    if m.get("tool_calls"):
        calls = [{**c, "function": {**c.get("function", {}), "arguments": arguments(c)}} for c in m["tool_calls"]]
        if fmt == MISTRAL:
            calls = [{**c, "id": nemo_id(c.get("id"))} for c in calls]
        m = {**m, "tool_calls": calls, "content": m.get("content") or ""}
    if fmt == MISTRAL and m.get("role") == "tool" and "tool_call_id" in m:
        m = {**m, "tool_call_id": nemo_id(m["tool_call_id"])}
    if fmt == HARMONY and isinstance(m.get("reasoning_content"), str):   # gpt-oss's template reads `thinking`
        m = {**m, "thinking": m["reasoning_content"]}
        if m.get("tool_calls"):   # its template refuses content beside thinking in a call's message
            m = {k: v for k, v in m.items() if k != "content"}
    return m


CONTINUE_MARK = "\u2063slotserver-continue\u2063"


def _render(template: ChatTemplate, messages: Any, tools: ToolConfig, add_generation_prompt: bool,
            variables: dict[str, Any] | None, extra: dict[str, Any]) -> str:
    if not isinstance(messages, list):   # the template's own checks name what is wrong
        return template.render(messages, add_generation_prompt, variables, **extra)
    if native_format(template.source) == tools.format:
        native = [_native_message(m, tools.format) for m in messages]
        shown = {"tools": list(tools.tools)} if tools.active else {}
        return template.render(native, add_generation_prompt, variables, **shown, **extra)
    return template.render(fallback_messages(messages, tools), add_generation_prompt, variables, **extra)


def render_with_tools(template: ChatTemplate, messages: Any, tools: ToolConfig | None,
                      add_generation_prompt: bool = True, continue_final: bool = False,
                      variables: dict[str, Any] | None = None, **extra: Any) -> str:
    """The prompt text; template problems are a 400 naming them. `continue_final`: the prompt ends
    inside the last (assistant) message, right after its content, so generation continues it (the
    template renders a marker in its place, and the text is cut there, as llama.cpp does).
    `variables`: more of the template's context (chat_template_kwargs). No `tools`: the history's
    calls are still written in the template's format."""
    if tools is None:
        tools = ToolConfig((), "auto", format=choose_format(template.source))
    if continue_final and isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        content = text_of(messages, len(messages) - 1)
        marked = [*messages[:-1], {**messages[-1], "content": CONTINUE_MARK}]
        text = render_with_tools(template, marked, tools, False, variables=variables, **extra)
        cut = text.rfind(CONTINUE_MARK)
        if cut < 0:
            raise bad_request("continue_final_message: the chat template does not render the final message")
        return text[:cut] + content
    try:
        return _render(template, messages, tools, add_generation_prompt, variables, extra)
    except ChatTemplateError as e:
        raise bad_request(str(e)) from None
