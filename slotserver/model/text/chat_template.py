"""Chat messages -> prompt text with the model's Jinja chat template.

Templates come from the model file, i.e. from strangers, so they run in jinja2's
`ImmutableSandboxedEnvironment`: no access to `_private` attributes, no mutation of the
messages, and an unsafe attribute access fails loudly instead of silently rendering "".
The environment mirrors the one transformers' `apply_chat_template` uses (trim_blocks,
lstrip_blocks, loop controls, `raise_exception`, `strftime_now`, a `tojson` that does not
HTML-escape), so HF-authored templates render the same text.

Every failure (bad template, bad messages, an exception inside the template) becomes a
`ChatTemplateError` with one readable line, suitable for an HTTP 400/500 body.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn

import jinja2
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from slotserver.errors import ChatTemplateError  # noqa: F401  re-export: defined without torch in slotserver.errors

if TYPE_CHECKING:
    from slotserver.model.text.tokenizer import Tokenizer

__all__ = ["CHATML_TEMPLATE", "ChatTemplate", "ChatTemplateError"]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class _TemplateRaised(Exception):
    """Raised by the template's own `raise_exception(msg)` call."""


def _raise_exception(message: str) -> NoReturn:
    raise _TemplateRaised(str(message))


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """Like HF's override: plain json.dumps, without jinja's HTML escaping of <, >, &, '."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


class _Sandbox(ImmutableSandboxedEnvironment):
    """Sandbox where touching an unsafe attribute raises instead of yielding Undefined."""

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        raise SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")


def _environment() -> _Sandbox:
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = _tojson
    return env


def _template_line(exc: BaseException) -> int | None:
    """Template line where a render error happened (jinja rewrites tracebacks to point there)."""
    line = getattr(exc, "lineno", None)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _normalize_content(index: int, content: Any) -> str:
    """A message's content as one string; text parts are joined with newlines like llama.cpp."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ChatTemplateError(
            f"messages[{index}].content must be a string or a list of text parts, "
            f"got {type(content).__name__}")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ChatTemplateError(
                f"messages[{index}].content[{j}]: only {{type: 'text'}} parts are supported, "
                f"got {kind!r}")
        if not isinstance(part.get("text"), str):
            raise ChatTemplateError(f"messages[{index}].content[{j}].text must be a string")
        texts.append(part["text"])
    return "\n".join(texts)


def _normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Validated copies of the messages, with content parts flattened to strings.

    A `null` content is allowed only for an assistant message carrying tool_calls (OpenAI form).
    """
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError("messages must be a non-empty list of {role, content} objects")
    result = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ChatTemplateError(f"messages[{i}] must be an object, got "
                                    f"{type(message).__name__}")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise ChatTemplateError(f"messages[{i}].role must be a non-empty string")
        copy = dict(message)
        content = message.get("content")
        if content is None and role == "assistant" and message.get("tool_calls"):
            copy["content"] = None
        elif "content" not in message:
            raise ChatTemplateError(f"messages[{i}] has no content")
        else:
            copy["content"] = _normalize_content(i, content)
        result.append(copy)
    return result


class ChatTemplate:
    """A compiled chat template; `render` is thread-safe (compiled templates are immutable)."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        if not isinstance(source, str) or not source.strip():
            raise ChatTemplateError("chat template is empty")
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(
                f"chat template syntax error at line {exc.lineno}: {exc.message}") from exc

    @property
    def supports_tools(self) -> bool:
        """The template renders `tools` itself (Qwen 2.5, Hermes...); llama.cpp detects this by
        rendering probes, a mention of the variable is the same signal for real templates."""
        return "tools" in self.source

    @property
    def supports_tool_calls(self) -> bool:
        """The template renders assistant `tool_calls` in the history."""
        return "tool_calls" in self.source

    @classmethod
    def from_metadata(cls, md: dict[str, Any], tokenizer: Tokenizer) -> ChatTemplate:
        """The model's `tokenizer.chat_template`, with its BOS/EOS token texts.

        A model without a template gets ChatML (`CHATML_TEMPLATE`), as llama.cpp does.
        """
        source = md.get("tokenizer.chat_template") or CHATML_TEMPLATE

        def text(token_id: int | None) -> str:
            return "" if token_id is None else tokenizer.decode([token_id], special=True)

        return cls(source, bos_token=text(tokenizer.bos_id), eos_token=text(tokenizer.eos_id))

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               variables: dict[str, Any] | None = None, **extra: Any) -> str:
        """The prompt text for `messages`; `extra` (tools, etc.) is passed to the template, and so
        is `variables`, a request's `chat_template_kwargs`, whose names may be anything."""
        context = {"bos_token": self.bos_token, "eos_token": self.eos_token, **(variables or {}), **extra,
                   "messages": _normalize_messages(messages),
                   "add_generation_prompt": add_generation_prompt}
        try:
            return self._template.render(context)
        except Exception as exc:  # any failure inside a stranger's template is a template error
            line = _template_line(exc)
            where = f" at line {line}" if line is not None else ""
            if isinstance(exc, _TemplateRaised):
                raise ChatTemplateError(f"chat template raised an error{where}: {exc}") from exc
            detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ChatTemplateError(f"chat template failed{where}: {detail}") from exc
