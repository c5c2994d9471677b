"""Which tool-call format a chat uses, chosen from the model's chat template as llama.cpp does.

Ten formats, each with its grammar (grammar.py), parser (calls.py, calls_json.py, calls_xml.py;
harmony's in server/harmony.py) and, for templates that do not speak it, a fallback prompt (fallback.py):

- hermes: Hermes 2/3, Qwen 2.5 and every other template that renders `tools` itself:
      <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>     (anywhere, one or more)
- llama3: Llama 3.1 / 3.2 / 3.3 (their templates have an `ipython` turn for tool results):
      {"name": "f", "parameters": {...}}     (the whole answer, optionally after <|python_tag|>)
- mistral: Mistral Nemo (`[TOOL_CALLS]` in the template, without Mistral Small 3.2's `[ARGS]`):
      [TOOL_CALLS][{"name": "f", "arguments": {...}, "id": "a1b2c3d4e"}]     (9-character ids)
- harmony: gpt-oss (templates that write `<|channel|>`), one call per turn, as a message to its
  recipient:  <|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}  (no fallback:
  only gpt-oss's own template renders it)
- qwen3_coder: Qwen3-Coder, Qwen3.5, Nemotron 3 Nano (templates that write `<function=` and
  `<parameter=` inside `<tool_call>`), a block per call, each argument a parameter block whose value
  is raw text (a string parameter) or JSON:
      <tool_call>\n<function=f>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>
- seed_oss: Seed-OSS, the same function block inside `<seed:tool_call>`, values without newlines
- glm: GLM-4.5/4.6/4.7-Flash (templates with `<arg_key>`/`<arg_value>`):
      <tool_call>f<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>
- granite: Granite 3.x (`<|tool_call|>` in the template), Mistral's array after its own marker:
      <|tool_call|>[{"name": "f", "arguments": {...}}]
- lfm2: LFM2 / LFM2.5 (templates with `<|tool_list_start|>`), a Python-style list of calls:
      <|tool_call_start|>[f(city="Paris", days=3)]<|tool_call_end|>
- generic: llama.cpp's "Generic" format, for templates without tool support: the answer is one
  JSON object, {"tool_call": {"name", "arguments"}} (or {"tool_calls": [...]} with parallel calls)
  or {"response": "text"}; every answer goes through its grammar.

The detection rules are those of llama.cpp's common/chat.cpp before its differential autoparser
(which reaches the same formats for these templates by rendering probes): a table of substrings a
template's source must hold, and must not. `--tool-call-format` picks the format by hand: `auto`
(the default) is the template's own, and for a template without tool support Hermes' blocks taught
in the system message (README "Request fields" says why Hermes and not generic); `hermes` or
`generic` force that format, taught by the fallback prompt to any template that does not render it.
"""

from __future__ import annotations

from dataclasses import dataclass

HERMES, LLAMA3, MISTRAL, GENERIC, HARMONY = "hermes", "llama3", "mistral", "generic", "harmony"
QWEN_XML, SEED_XML, GLM = "qwen3_coder", "seed_oss", "glm"   # the XML formats (calls_xml.py)
LFM2 = "lfm2"                                                 # Python-style calls (calls_python.py)
GRANITE, GRANITE_MARKER = "granite", "<|tool_call|>"          # Granite 3.x: a JSON list after its marker
OPEN, CLOSE = "<tool_call>", "</tool_call>"   # a Hermes call's block
CHOICES = ("auto", HERMES, GENERIC)   # the values of --tool-call-format
MISTRAL_MARKER, PYTHON_TAG = "[TOOL_CALLS]", "<|python_tag|>"   # what opens a Mistral / Llama call
MISTRAL_ID = "[a-zA-Z0-9]{9}"         # the call ids Mistral Nemo's template accepts (regex)
ID_CHARS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass(frozen=True)
class NativeRule:
    """A template whose source holds every `needs` and no `lacks` renders this format itself."""

    format: str
    needs: tuple[str, ...]
    lacks: tuple[str, ...] = ()

    def matches(self, source: str) -> bool:
        return all(s in source for s in self.needs) and not any(s in source for s in self.lacks)


# In llama.cpp's order: the first rule that matches wins.
NATIVE_RULES = (
    # gpt-oss (llama.cpp's specialized GPT-OSS handler, tried before its other checks): harmony
    # messages, parsed with the answer's reasoning (server/harmony.py)
    NativeRule(HARMONY, ("<|channel|>",)),
    # Mistral Small 3.2 / Devstral / Ministral write [TOOL_CALLS]name[ARGS]{...}: not this format.
    NativeRule(MISTRAL, (MISTRAL_MARKER,), ("[ARGS]",)),
    # Functionary v3.1 also has an ipython turn, but calls with <function=...>.
    NativeRule(LLAMA3, ("<|start_header_id|>ipython<|end_header_id|>",), ("<function=",)),
    # The XML formats (calls_xml.py): Seed-OSS's <seed:tool_call> around Qwen3-Coder's function block;
    # Qwen3-Coder / Qwen3.5 / Nemotron 3: <tool_call><function=NAME><parameter=KEY>value</parameter>...;
    # GLM-4.5/4.6/4.7 (and Ling, Laguna): <tool_call>NAME<arg_key>KEY</arg_key><arg_value>value</arg_value>...
    # Granite 3.x (llama.cpp's granite handler): <|tool_call|>[{"name": ..., "arguments": {...}}]
    NativeRule(GRANITE, (GRANITE_MARKER,)),
    # LFM2 / LFM2.5 (llama.cpp's is_lfm2_template): <|tool_call_start|>[f(key="v")]<|tool_call_end|>
    NativeRule(LFM2, ("<|tool_list_start|>", "<|tool_list_end|>")),
    NativeRule(LFM2, ("List of tools: [",)),   # LFM2.5: the same calls, its tool list in plain text
    NativeRule(SEED_XML, ("<seed:tool_call>", "<function=", "<parameter=")),
    NativeRule(QWEN_XML, ("<tool_call>", "<function=", "<parameter=")),
    NativeRule(GLM, ("<tool_call>", "<arg_key>", "<arg_value>")),
    # Any other template that renders `tools` (llama.cpp probes it; the mention is the same
    # signal for real templates): Hermes blocks, what Qwen 2.5 and Hermes 2/3 templates teach.
    NativeRule(HERMES, ("tools",)),
)


def native_format(source: str | None) -> str | None:
    """The tool-call format the template renders itself (tools, history calls), or None."""
    if not source:
        return None
    return next((rule.format for rule in NATIVE_RULES if rule.matches(source)), None)


def choose_format(source: str | None, preference: str = "auto") -> str:
    """The format of a request's calls: the template's own under `auto`, Hermes for a template
    without tool support; `hermes` or `generic` when the server was told so."""
    if preference not in CHOICES:
        raise ValueError(f"tool-call format must be one of {', '.join(CHOICES)}, got {preference!r}")
    if preference != "auto":
        return preference
    return native_format(source) or HERMES
