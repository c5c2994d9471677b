"""What a chat request passes to the chat template and how its answer is split into reasoning.

llama-server's fields (tools/server/server-common.cpp `oaicompat_chat_params_parse`):
- `chat_template_kwargs`: an object whose entries become variables of the template's context
  (e.g. `{"enable_thinking": false}` for Qwen 3), merged over the server's `--chat-template-kwargs`.
  `enable_thinking`, when given, must be a boolean.
- `reasoning_effort`: "none" turns thinking off; any other value reaches the template as
  `reasoning_effort` (gpt-oss style templates read it).
- `reasoning_format`: none | auto | deepseek | deepseek-legacy (reasoning.py), default
  `--reasoning-format` (auto).
- `reasoning_budget_tokens` (alias `thinking_budget_tokens`) and `--reasoning-budget` do not
  touch the template (budget 0 forces `</think>` at once instead, as llama.cpp's budget sampler
  does): budget_fields.py.

Every template gets `enable_thinking` (true unless turned off), as llama.cpp passes it; templates
that do not think ignore it. Every template also gets llama.cpp's `preserve_reasoning` (true unless
`--no-reasoning-preserve` or a request's `chat_template_kwargs` sets it false) with the variables
templates of several families read for it (common/jinja/caps.cpp caps_apply_preserve_reasoning):
`preserve_thinking`, and `clear_thinking`, `truncate_history_thinking`, `drop_thinking` as its
opposite, each under a value the request or `--chat-template-kwargs` gives itself; and with a
`reasoning_effort`, `reasoning_strength` as its alias.

`--no-prefill-assistant` makes a final assistant message a whole message instead of the start of
the answer (openai_params.py `_continuation`); `--skip-chat-parsing` leaves every answer as content,
its reasoning and tool calls unparsed (llama-server's pure content parser).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from slotserver.model.config import ConfigError
from slotserver.server.errors import bad_request
from slotserver.server.fields import Fields
from slotserver.server.reasoning import FORMATS
from slotserver.server.tools.formats import CHOICES as TOOL_FORMATS

RESERVED = ("messages", "add_generation_prompt", "tools")   # set by the request's own fields
ON, OFF = ("on", "enabled", "true", "1"), ("off", "disabled", "false", "0")   # llama.cpp's is_truthy/is_falsey


@dataclass(frozen=True)
class ChatDefaults:
    """Server flags: --reasoning-format, --chat-template-kwargs, --reasoning, --tool-call-format
    (tools/formats.py)."""

    reasoning_format: str = "auto"
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    tool_format: str = "auto"
    prefill_assistant: bool = True    # --[no-]prefill-assistant
    pure_content: bool = False        # --skip-chat-parsing

    def __post_init__(self) -> None:
        if self.reasoning_format not in FORMATS:
            raise ConfigError(f"--reasoning-format must be one of {', '.join(FORMATS)}, got {self.reasoning_format!r}")
        if self.tool_format not in TOOL_FORMATS:
            raise ConfigError(f"--tool-call-format must be one of {', '.join(TOOL_FORMATS)}, got {self.tool_format!r}")
        if not isinstance(self.template_kwargs, dict):
            raise ConfigError("--chat-template-kwargs must be a JSON object")
        _check_kwargs(self.template_kwargs, ConfigError, "--chat-template-kwargs")


def flag_json_object(text: str | None, flag: str, example: str = "") -> dict[str, Any]:
    """A flag's JSON object (None: {}); a ConfigError naming the flag otherwise."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{flag} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{flag} must be a JSON object,{example}" if example else f"{flag} must be a JSON object")
    return value


def chat_defaults_from_flags(reasoning_format: str = "auto", kwargs_json: str | None = None,
                             reasoning: str = "auto", tool_format: str = "auto",
                             effort: str = "default", preserve: bool = True, prefill_assistant: bool = True,
                             pure_content: bool = False) -> ChatDefaults:
    """The flags -> ChatDefaults; a bad value is a ConfigError (one line, exit status 2).
    `--reasoning on|off` sets the default `enable_thinking`, and `--reasoning-effort LEVEL` the
    template's `reasoning_effort` (`default`: the template's own), as in llama-server."""
    kwargs = flag_json_object(kwargs_json, "--chat-template-kwargs", " e.g. '{\"enable_thinking\": false}'")
    if effort != "default":
        kwargs["reasoning_effort"] = effort
    if reasoning in ON or reasoning in OFF:
        kwargs["enable_thinking"] = reasoning in ON
    elif reasoning not in ("auto", "-1"):
        raise ConfigError(f"--reasoning must be on, off or auto, got {reasoning!r}")
    kwargs.setdefault("preserve_reasoning", preserve)   # llama.cpp's default: true
    return ChatDefaults(reasoning_format, kwargs, tool_format, prefill_assistant, pure_content)


def _check_kwargs(kwargs: dict, error: type[Exception], name: str) -> None:
    for key in RESERVED:
        if key in kwargs:
            raise error(f"'{name}' may not set '{key}': use the request's own '{key}' field")
    thinking = kwargs.get("enable_thinking")
    if thinking is not None and not isinstance(thinking, bool):
        raise error(f"'{name}.enable_thinking' must be a boolean, got {json.dumps(thinking)[:40]}")


def reasoning_format(f: Fields, default: str) -> str:
    value = f.str("reasoning_format", default)
    if value not in FORMATS:
        raise bad_request(f"'reasoning_format' must be one of {', '.join(FORMATS)}, got {value!r}")
    return value


@dataclass(frozen=True)
class ChatOptions:
    context: dict[str, Any]     # extra variables of the template's context
    reasoning_format: str


def chat_options(f: Fields, defaults: ChatDefaults) -> ChatOptions:
    """The request's template context and reasoning format, over the server's defaults."""
    fmt = reasoning_format(f, defaults.reasoning_format)
    own = f.obj("chat_template_kwargs") or {}
    _check_kwargs(own, bad_request, "chat_template_kwargs")
    context = {**defaults.template_kwargs, **own}
    thinking = context.get("enable_thinking", True)
    effort = f.str("reasoning_effort")
    if effort == "none":
        thinking = False
        context.pop("reasoning_effort", None)
    elif effort:
        context["reasoning_effort"] = effort
    context["enable_thinking"] = thinking
    return ChatOptions({**_implied(context), **context}, "none" if defaults.pure_content else fmt)


def _implied(context: dict[str, Any]) -> dict[str, Any]:
    """The variables llama.cpp derives from `preserve_reasoning` and `reasoning_effort` (module doc)."""
    out: dict[str, Any] = {}
    keep = context.get("preserve_reasoning")
    if isinstance(keep, bool):
        out = {"preserve_thinking": keep, "clear_thinking": not keep, "truncate_history_thinking": not keep,
               "drop_thinking": not keep}
    effort = context.get("reasoning_effort")
    if isinstance(effort, str) and effort:
        out["reasoning_strength"] = effort
    return out
