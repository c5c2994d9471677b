"""What a chat template can render, found the way llama.cpp finds it: by rendering probes.

llama.cpp (common/jinja/caps.cpp) renders each template with probe messages while its Jinja
runtime records which values the template read and how; common/chat.cpp then reshapes the
messages to fit (chat_messages.py). The capabilities that change a prompt:

- `supports_system_role`: rendering `[system, user]` reads the system message's content. When it
  does not (gemma 2 raises "System role not supported", Phi-3-medium style templates skip the
  role), llama-server merges the system message into the next one.
- `supports_string_content` / `supports_typed_content`: whether `content` may be a string and/or a
  list of `{"type": "text", "text": ...}` parts. A template that only takes strings gets parts
  joined with newlines; one that takes both (gemma 3 iterates and trims each part) gets the list.
- `supports_object_arguments`: a history call's `arguments` is read as an object (its probe key
  used: `arguments|items` in Qwen3-Coder / Qwen3.5 / GLM templates). llama-server then decodes
  every JSON-string `arguments` of the messages into its object (func_args_not_string); so do we.

Python's jinja2 records nothing, so the probe values do: `_ProbeDict` notes the keys read,
`_ProbeStr` / `_ProbeList` note iteration and integer indexing (llama.cpp's "array_access"), and
the environment's `string` test notes being asked (chat_template.py installs `is_string` and
`is_iterable` in every environment; they behave as jinja2's own for any other value).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

STRING_MARKER = "STRING_MARKER"   # llama.cpp's probe content


class _Probe:
    """A probe value's record of how the template used it: iterating it or indexing it by an
    integer is an array access (mixed in before str / list, whose methods it wraps)."""

    ops: set[str]

    def __iter__(self):
        self.ops.add("array_access")
        return super().__iter__()

    def __getitem__(self, key):
        if isinstance(key, int):
            self.ops.add("array_access")
        return super().__getitem__(key)


class _ProbeStr(_Probe, str):
    pass


class _ProbeList(_Probe, list):
    pass


class _ProbeDict(dict):
    """A message that notes which of its keys the template read (`m.content`, `m['content']`,
    `m.get('content')` all end here)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reads: set[str] = set()

    def __getitem__(self, key):
        self.reads.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.reads.add(key)
        return super().get(key, default)

    def items(self):   # `|items` and `.items()` read every value
        self.reads.update(self.keys())
        return super().items()

    def values(self):
        self.reads.update(self.keys())
        return super().values()


def _probe(cls: type, value: Any) -> Any:
    obj = cls(value)
    obj.ops = set()
    return obj


def is_string(value: Any) -> bool:
    """jinja2's `string` test, noting the question on a probe value (llama.cpp: test_is_string)."""
    if isinstance(value, _Probe):
        value.ops.add("test_is_string")
    return isinstance(value, str)


def is_iterable(value: Any) -> bool:
    """jinja2's `iterable` test without iterating a probe value (which would read as an access)."""
    if isinstance(value, _Probe):
        return True
    try:
        iter(value)
    except TypeError:
        return False
    return True


@dataclass(frozen=True)
class TemplateCaps:
    supports_system_role: bool = True
    supports_string_content: bool = True
    supports_typed_content: bool = False
    supports_object_arguments: bool = False   # history calls' arguments read as an object (Qwen3.5, GLM)

    def to_map(self) -> dict[str, bool]:
        """The entries of llama-server's /props `chat_template_caps` that we compute."""
        return {"supports_string_content": self.supports_string_content,
                "supports_typed_content": self.supports_typed_content,
                "supports_system_role": self.supports_system_role,
                "supports_object_arguments": self.supports_object_arguments}


Render = Callable[[dict[str, Any]], str]


def _try(render: Render, messages: list[dict], tools: list | None = None) -> str | None:
    """The probe's output, or None when the template failed (llama.cpp ignores why)."""
    context = {"messages": messages, "tools": tools or [], "bos_token": "", "eos_token": "",
               "add_generation_prompt": True}
    try:
        return render(context)
    except Exception:  # noqa: BLE001  any failure of a stranger's template is "not supported"
        return None


def _content_caps(render: Render) -> tuple[bool, bool]:
    """(string, typed) as caps_get decides them: a string probe, then an empty list probe when
    the template asked whether the content is a string."""
    content = _probe(_ProbeStr, STRING_MARKER)
    out = _try(render, [_ProbeDict(role="user", content=content)])
    as_array = "array_access" in content.ops
    string = out is not None and not (as_array and STRING_MARKER not in out)
    typed = as_array
    if "test_is_string" in content.ops:
        parts = _probe(_ProbeList, [])
        if _try(render, [_ProbeDict(role="user", content=parts)]) is not None and "array_access" in parts.ops:
            typed = True
    return string, typed


def _system_role(render: Render) -> bool:
    system = _ProbeDict(role="system", content="System message")
    _try(render, [system, _ProbeDict(role="user", content="User message")])
    return "content" in system.reads


PROBE_TOOL = {"name": "tool", "type": "function", "function": {
    "name": "tool1", "description": "Tool description",
    "parameters": {"type": "object", "properties": {"arg": {"type": "string", "description": "Arg description"}},
                   "required": ["arg"]}}}


def _object_arguments(render: Render) -> bool:
    """Whether a history call's `arguments` is read as an object (llama.cpp's
    supports_object_arguments: its probe call's `arguments.arg` used): Qwen3-Coder, Qwen3.5, GLM and
    others iterate `arguments|items`, and fail on the JSON string an OpenAI client sends."""
    args = _ProbeDict(arg="value")
    call = {"id": "call00001", "type": "function", "function": {"name": "tool1", "arguments": args}}
    _try(render, [_ProbeDict(role="user", content="User message"),   # llama.cpp's probe, message for message
                  _ProbeDict(role="assistant", content="", tool_calls=[call]),
                  _ProbeDict(role="tool", content="Tool response", tool_call_id="call00001"),
                  _ProbeDict(role="assistant", content="The tool response was 'tool response'"),
                  _ProbeDict(role="user", content="User message")], [PROBE_TOOL])
    return "arg" in args.reads


def probe_caps(render: Render) -> TemplateCaps:
    """The capabilities of the template that `render(context)` renders."""
    string, typed = _content_caps(render)
    return TemplateCaps(supports_system_role=_system_role(render), supports_string_content=string,
                        supports_typed_content=typed, supports_object_arguments=_object_arguments(render))
