"""Chat messages -> prompt text with the model's Jinja chat template.

Templates come from the model file, i.e. from strangers, so they run in jinja2's
`ImmutableSandboxedEnvironment`: no access to `_private` attributes, no mutation of the
messages, and an unsafe attribute access fails loudly instead of silently rendering "".
The environment mirrors the one transformers' `apply_chat_template` uses (trim_blocks,
lstrip_blocks, loop controls, `raise_exception`, `strftime_now`, a `tojson` that does not
HTML-escape), so HF-authored templates render the same text.

Around the rendering, what llama-server's chat layer (common/chat.cpp) adds: the messages are
reshaped to what the template can take (chat_messages.py, from capabilities probed as llama.cpp
probes them: template_caps.py), and the BOS (EOS) text a template writes itself is cut off the
prompt when tokenizing adds that token anyway (`add_bos`), so gemma and llama 3 prompts start with
one BOS, not two. /apply-template shows the prompt so cut, as llama-server's does.

A template may also be one of llama.cpp's built-in names (`--chat-template gemma`): those are not
Jinja, they are formatted as llama-server's C++ formats them (builtin_templates.py), from each
message's role and text, with nothing added or cut around them.

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
from slotserver.model.text.builtin_templates import BUILTIN_NAMES, apply_builtin, is_builtin
from slotserver.model.text.chat_messages import fit_messages, join_parts, parse_messages
from slotserver.model.text.template_caps import TemplateCaps, is_iterable, is_string, probe_caps

if TYPE_CHECKING:
    from slotserver.model.text.tokenizer import Tokenizer

__all__ = ["BUILTIN_NAMES", "CHATML_TEMPLATE", "ChatTemplate", "ChatTemplateError", "named_template"]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def named_template(name: str) -> str | None:
    """The template source `--chat-template NAME` stands for, or None when NAME is not a name.

    `chatml` is ChatML's Jinja, the template llama-server compiles for that name under its default
    --jinja (so the model's tokens and the caps-driven message fitting apply as before). Every other
    llama.cpp name stays the name: ChatTemplate formats it as llama-server's C++ does, the only
    route on which the peer gives that name a format."""
    if name == "chatml":
        return CHATML_TEMPLATE
    return name if is_builtin(name) else None


class _TemplateRaised(Exception):
    """Raised by the template's own `raise_exception(msg)` call."""


def _raise_exception(message: str) -> NoReturn:
    raise _TemplateRaised(str(message))


_clock = datetime.now   # tests freeze it (templates print today's date)


def _strftime_now(fmt: str) -> str:
    return _clock().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """Like HF's override: plain json.dumps, without jinja's HTML escaping of <, >, &, '."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


class _Sandbox(ImmutableSandboxedEnvironment):
    """Sandbox where touching an unsafe attribute raises instead of yielding Undefined.

    Undefined values chain (`messages[0].role` of no messages is undefined, not an error), as in
    llama.cpp's Jinja runtime: gemma 2's template renders a conversation whose only (system)
    message llama-server dropped."""

    intercepted_binops = frozenset({"+"})

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        raise SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        """`+` of a string and null or undefined is the string, as llama.cpp's runtime's workaround
        (common/jinja/runtime.cpp): gpt-oss's template writes `"// " + tool.description` for every
        tool, and a tool without a description is common in OpenAI requests."""
        if operator == "+" and (_nullish(left) and isinstance(right, str) or _nullish(right) and isinstance(left, str)):
            return ("" if _nullish(left) else left) + ("" if _nullish(right) else right)
        return super().call_binop(context, operator, left, right)


def _nullish(value: Any) -> bool:
    return value is None or isinstance(value, jinja2.Undefined)


def _environment() -> _Sandbox:
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"],
                   undefined=jinja2.ChainableUndefined)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = _tojson
    env.tests["string"], env.tests["iterable"] = is_string, is_iterable   # probe-aware, else jinja2's
    return env


def _compile(source: str) -> jinja2.Template:
    """The sandboxed Jinja template, a syntax error being one ChatTemplateError line."""
    try:
        return _environment().from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template syntax error at line {exc.lineno}: {exc.message}") from exc


def _template_line(exc: BaseException) -> int | None:
    """Template line where a render error happened (jinja rewrites tracebacks to point there)."""
    line = getattr(exc, "lineno", None)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


class ChatTemplate:
    """A compiled chat template; `render` is thread-safe (compiled templates are immutable).

    `add_bos` / `add_eos`: the tokenizer adds BOS / EOS to the prompt itself (llama.cpp's
    `common_chat_templates.add_bos`). `from_model`: the source is the model's own template, not
    ChatML put in for a model without one. `builtin`: the llama.cpp template name the source is
    (formatted by builtin_templates.py, not Jinja), else None.
    """

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", add_bos: bool = False,
                 add_eos: bool = False, from_model: bool = True) -> None:
        if not isinstance(source, str) or not source.strip():
            raise ChatTemplateError("chat template is empty")
        self.source, self.bos_token, self.eos_token = source, bos_token, eos_token
        self.add_bos, self.add_eos, self.from_model = add_bos, add_eos, from_model
        self.builtin: str | None = source if is_builtin(source) else None
        self._template = None if self.builtin else _compile(source)
        self.caps: TemplateCaps = TemplateCaps() if self._template is None else probe_caps(self._template.render)

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

        A model without a template gets ChatML (`CHATML_TEMPLATE`), as llama.cpp does: e.g. the
        gemma-3-270m GGUFs that carry no template are prompted in ChatML by llama-server too.
        """
        source = md.get("tokenizer.chat_template")

        def text(token_id: int | None) -> str:
            return "" if token_id is None else tokenizer.decode([token_id], special=True)

        return cls(source or CHATML_TEMPLATE, bos_token=text(tokenizer.bos_id), eos_token=text(tokenizer.eos_id),
                   add_bos=tokenizer.add_bos, add_eos=tokenizer.add_eos, from_model=bool(source))

    def with_source(self, source: str) -> ChatTemplate:
        """Another template (--chat-template) for the same model: same tokens, same BOS rule."""
        return ChatTemplate(source, self.bos_token, self.eos_token, self.add_bos, self.add_eos)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               variables: dict[str, Any] | None = None, **extra: Any) -> str:
        """The prompt text for `messages`; `extra` (tools, etc.) is passed to the template, and so
        is `variables`, a request's `chat_template_kwargs`, whose names may be anything."""
        if self.builtin is not None:
            return self._render_builtin(messages, add_generation_prompt)
        context = {"bos_token": self.bos_token, "eos_token": self.eos_token, **(variables or {}), **extra,
                   "messages": fit_messages(messages, self.caps, self.source),
                   "add_generation_prompt": add_generation_prompt}
        return self._drop_added_specials(self._render(context))

    def _render_builtin(self, messages: Any, add_generation_prompt: bool) -> str:
        """llama-server's legacy route (common_chat_templates_apply_legacy): each message as its role
        and text (parts joined by newlines), no template variables, and nothing cut: that route
        cuts no BOS/EOS text, so a format that writes one (GigaChat's `<s>`) keeps it."""
        chat = [(m["role"], m["content"] if isinstance(m["content"], str) else join_parts(m["content"]))
                for m in parse_messages(messages)]
        return apply_builtin(self.builtin, chat, add_generation_prompt)

    def _drop_added_specials(self, text: str) -> str:
        """llama.cpp's rule after rendering: the template's leading BOS (trailing EOS) text goes
        when tokenizing the prompt adds that token anyway."""
        if self.add_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token):]
        if self.add_eos and self.eos_token and text.endswith(self.eos_token):
            text = text[:-len(self.eos_token)]
        return text

    def _render(self, context: dict[str, Any]) -> str:
        try:
            return self._template.render(context)
        except Exception as exc:  # any failure inside a stranger's template is a template error
            line = _template_line(exc)
            where = f" at line {line}" if line is not None else ""
            if isinstance(exc, _TemplateRaised):
                raise ChatTemplateError(f"chat template raised an error{where}: {exc}") from exc
            detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ChatTemplateError(f"chat template failed{where}: {detail}") from exc
