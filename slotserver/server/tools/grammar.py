"""The grammar (llguidance Lark with embedded JSON schemas) that forces a tool call in each format.

Used for tool_choice "required" or a named function, and for every answer of the generic format.
Each call's JSON comes from the tools' own parameter schemas, so the call always parses and
matches (as vLLM does; llama.cpp builds the same shapes in GBNF): the function name is a `const`,
the arguments are that function's `parameters`, nothing else is allowed in the call object. JSON
is compact with llama.cpp's separators (engine/grammar.py JSON_OPTIONS).

The formats' markers are written as text: a vocabulary whose `[TOOL_CALLS]` or `<tool_call>` is a
control token spells it with plain tokens under the grammar (control tokens never match grammar
text), which detokenizes to the same marker for the parser.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from slotserver.engine.grammar import JSON_OPTIONS
from slotserver.server.errors import bad_request
from slotserver.server.tools.calls_xml import takes_text
from slotserver.server.tools.formats import (CLOSE, GENERIC, GLM, GRANITE, GRANITE_MARKER, HARMONY, HERMES, LFM2,
                                             LLAMA3, MISTRAL, MISTRAL_ID, MISTRAL_MARKER, OPEN, QWEN_XML, SEED_XML)
from slotserver.server.tools.request import ToolConfig

ID_SCHEMA = {"type": "string", "pattern": f"^{MISTRAL_ID}$"}   # what Nemo's template demands


def _one_of(options: list[dict]) -> dict:
    return options[0] if len(options) == 1 else {"anyOf": options}


def call_schema(tools: ToolConfig, args_key: str = "arguments", extra: dict | None = None) -> dict:
    """JSON Schema of one call's object: {"name": one of the allowed functions, args_key: its
    parameters, and the `extra` properties (all required)}."""
    options = []
    for t in tools.allowed:
        props = {"name": {"const": t["function"]["name"]}, args_key: t["function"]["parameters"], **(extra or {})}
        options.append({"type": "object", "additionalProperties": False, "required": list(props),
                        "properties": props})
    return _one_of(options)


def _json_rule(name: str, schema: dict) -> str:
    return f"{name}: %json {json.dumps({**schema, 'x-guidance': JSON_OPTIONS})}\n"


def hermes_grammar(tools: ToolConfig) -> str:
    """One `<tool_call>` block, or several on their own lines with parallel_tool_calls."""
    rep = ' ("\\n" call)*' if tools.parallel else ""
    return (f'start: call{rep}\n'
            f'call: "{OPEN}\\n" json_call "\\n{CLOSE}"\n' + _json_rule("json_call", call_schema(tools)))


def llama3_grammar(tools: ToolConfig) -> str:
    """The whole answer is one {"name", "parameters"} object (Llama 3.x calls one at a time)."""
    return "start: json_call\n" + _json_rule("json_call", call_schema(tools, "parameters"))


def mistral_grammar(tools: ToolConfig) -> str:
    """`[TOOL_CALLS]` and an array of {"name", "arguments", "id"}: one item, or more with
    parallel_tool_calls."""
    array = {"type": "array", "items": call_schema(tools, extra={"id": ID_SCHEMA}), "minItems": 1}
    if not tools.parallel:
        array["maxItems"] = 1
    return f'start: "{MISTRAL_MARKER}" json_calls\n' + _json_rule("json_calls", array)


def granite_grammar(tools: ToolConfig) -> str:
    """Granite 3.x: `<|tool_call|>` and an array of {"name", "arguments"} (one, or more with
    parallel_tool_calls)."""
    array = {"type": "array", "items": call_schema(tools), "minItems": 1}
    if not tools.parallel:
        array["maxItems"] = 1
    return f"start: {_lit(GRANITE_MARKER)} json_calls\n" + _json_rule("json_calls", array)


def generic_schema(tools: ToolConfig) -> dict:
    """llama.cpp's generic answer: {"tool_call": call} ({"tool_calls": [call, ...]} with parallel
    calls), or, unless a call is forced, {"response": "text"}."""
    if tools.parallel:
        calls = {"type": "array", "items": call_schema(tools), "minItems": 1}
        call = {"type": "object", "additionalProperties": False, "required": ["tool_calls"],
                "properties": {"tool_calls": calls}}
    else:
        call = {"type": "object", "additionalProperties": False, "required": ["tool_call"],
                "properties": {"tool_call": call_schema(tools)}}
    if tools.choice in ("required", "named"):
        return call
    response = {"type": "object", "additionalProperties": False, "required": ["response"],
                "properties": {"response": {"type": "string"}}}
    return {"anyOf": [call, response]}


def generic_grammar(tools: ToolConfig) -> str:
    return "start: json_answer\n" + _json_rule("json_answer", generic_schema(tools))


def harmony_grammar(tools: ToolConfig) -> str:
    """gpt-oss: one message to the function, in the channel-header form llama.cpp's grammar allows
    (`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS`); one call per turn."""
    rules = [f'call{i}: "<|channel|>commentary to=functions.{t["function"]["name"]} <|constrain|>json<|message|>" '
             f'args{i}\n' + _json_rule(f"args{i}", t["function"]["parameters"]) for i, t in enumerate(tools.allowed)]
    return "start: " + " | ".join(f"call{i}" for i in range(len(rules))) + "\n" + "".join(rules)


def _lit(text: str) -> str:
    """A Lark string literal of `text` (JSON's escapes, which llguidance's Lark reads)."""
    return json.dumps(text)


def _xml_params(tools: ToolConfig, key_open: str, key_close: str, newline: bool, close: str,
                json_close: str) -> tuple[list[str], list[str]]:
    """Per allowed function its parameter sequence (rule names, schema order, required ones
    mandatory) and the rules: `key_open KEY key_close VALUE close`, a string value as `_text`
    (with a trailing newline where `newline`: Qwen3-Coder's value ends with the one before
    `</parameter>`), any other as JSON of its schema closed by `json_close`."""
    bodies, rules = [], []
    for i, t in enumerate(tools.allowed):
        params = t["function"].get("parameters") or {}
        required, seq = set(params.get("required") or ()), []
        for j, (key, schema) in enumerate((params.get("properties") or {}).items()):
            name, head = f"f{i}_p{j}", _lit(key_open + key + key_close)
            if takes_text(schema):   # (the parser reads it as calls_xml.typed_value: null, numbers... or text)
                rules.append(f"{name}: {head} {name}_v {_lit(close)}\n{name}_v: {_text(schema, newline)}\n")
            else:
                rules.append(f"{name}: {head} {name}_v {_lit(json_close)}\n" + _json_rule(f"{name}_v", schema))
            seq.append(name if key in required else f"{name}?")
        bodies.append(" ".join(seq))
    return bodies, rules


def _text(schema: object, newline: bool) -> str:
    """A text value: one of its string `enum`, else text without `<` of its min/maxLength.
    Why no `<`: llguidance's lexemes are greedy, so a value that could run on into its closing tag
    would swallow it (and a lazy `stop` may need the engine to take back bytes already sent). Other
    string keywords (pattern, format) are not enforced in these formats' forced calls."""
    end = "\n" if newline else ""
    schema = schema if isinstance(schema, dict) else {}
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        return "(" + " | ".join(_lit(v + end) for v in enum) + ")"
    lo, hi = int(schema.get("minLength", 0) or 0), schema.get("maxLength")
    count = f"{{{lo},{int(hi)}}}" if isinstance(hi, int) else (f"{{{lo},}}" if lo else "*")
    return f"/[^<]{count}{chr(92) + 'n' if newline else ''}/"


def _xml_grammar(tools: ToolConfig, open_: str, close: str, fns: list[str], rules: list[str]) -> str:
    """One block (`open_` a function's rule `close`), or several on their own lines with
    parallel_tool_calls."""
    rep = ' ("\\n" call)*' if tools.parallel else ""
    choice = " | ".join(f"fn{i}" for i in range(len(fns)))
    return f"start: call{rep}\ncall: {_lit(open_)} ({choice}) {_lit(close)}\n" + "\n".join(fns) + "\n" + "".join(rules)


def _function_blocks(tools: ToolConfig, bodies: list[str]) -> list[str]:
    """Qwen3-Coder's `<function=NAME>` blocks around each function's parameters."""
    return [f"fn{i}: {_lit('<function=' + t['function']['name'] + '>' + chr(10))} {body} {_lit('</function>' + chr(10))}"
            for i, (t, body) in enumerate(zip(tools.allowed, bodies))]


def qwen_xml_grammar(tools: ToolConfig) -> str:
    """Qwen3-Coder's blocks; a string value's text ends with the newline before `</parameter>`."""
    bodies, rules = _xml_params(tools, "<parameter=", ">\n", True, "</parameter>\n", "\n</parameter>\n")
    return _xml_grammar(tools, "<tool_call>\n", "</tool_call>", _function_blocks(tools, bodies), rules)


def seed_xml_grammar(tools: ToolConfig) -> str:
    """Seed-OSS's: the same function blocks in `<seed:tool_call>`, values without newlines."""
    bodies, rules = _xml_params(tools, "<parameter=", ">", False, "</parameter>\n", "</parameter>\n")
    return _xml_grammar(tools, "<seed:tool_call>\n", "</seed:tool_call>", _function_blocks(tools, bodies), rules)


def glm_grammar(tools: ToolConfig) -> str:
    """GLM's blocks: the name, then each argument's key and value (GLM-4.7's form, no newlines)."""
    bodies, rules = _xml_params(tools, "<arg_key>", "</arg_key><arg_value>", False, "</arg_value>", "</arg_value>")
    fns = [f"fn{i}: {_lit(t['function']['name'])} {body}" for i, (t, body) in enumerate(zip(tools.allowed, bodies))]
    return _xml_grammar(tools, "<tool_call>", "</tool_call>", fns, rules)


def lfm2_grammar(tools: ToolConfig) -> str:
    """LFM2's block: a Python-style list of calls, each argument `key=` and JSON of its schema (true,
    false and null read as Python's), in the schema's order, each at most once, the required ones
    there (`_keywords`); several calls with parallel_tool_calls."""
    rules, fns = [], []
    for i, t in enumerate(tools.allowed):
        params = t["function"].get("parameters") or {}
        props, required = params.get("properties") or {}, set(params.get("required") or ())
        for j, (key, schema) in enumerate(props.items()):
            rules.append(f"f{i}_a{j}: {_lit(key + '=')} f{i}_v{j}\n" + _json_rule(f"f{i}_v{j}", schema))
        head, seq = _keywords(f"f{i}", [key in required for key in props])
        rules.extend(seq)
        fns.append(f"fn{i}: {_lit(t['function']['name'] + '(')} {head} \")\"")
    choice = " | ".join(f"fn{i}" for i in range(len(fns)))
    rep = ' (", " call)*' if tools.parallel else ""
    return (f'start: "<|tool_call_start|>[" call{rep} "]<|tool_call_end|>"\ncall: {choice}\n' + "\n".join(fns) + "\n"
            + "".join(rules))


def _keywords(fn: str, required: list[bool]) -> tuple[str, list[str]]:
    """The arguments `{fn}_a{k}` in order, each optional one skippable, ", " between those written:
    (the reference to start with, its rules). Rule `{fn}_s{k}{o}`: the arguments from k on, o 1 when
    one was written before (so each starts with its ", "); linear in the arguments."""
    n, rules = len(required), []
    empty_ok = [all(not r for r in required[k:]) for k in range(n + 1)]

    def ref(k: int, after: int) -> str:
        return "" if k == n else f"{fn}_s{k}{after}" + ("?" if empty_ok[k] else "")
    for k in range(n):
        for after in (0, 1):
            alts = [" ".join(x for x in ('", "' if after else "", f"{fn}_a{k}", ref(k + 1, 1)) if x)]
            if not required[k] and k + 1 < n:
                alts.append(f"{fn}_s{k + 1}{after}")
            rules.append(f"{fn}_s{k}{after}: " + " | ".join(alts) + "\n")
    return ref(0, 0), rules


GRAMMARS: dict[str, Callable[[ToolConfig], str]] = {
    HERMES: hermes_grammar, LLAMA3: llama3_grammar, MISTRAL: mistral_grammar, GENERIC: generic_grammar,
    HARMONY: harmony_grammar, QWEN_XML: qwen_xml_grammar, SEED_XML: seed_xml_grammar, GLM: glm_grammar,
    LFM2: lfm2_grammar, GRANITE: granite_grammar}


def forced_call_grammar(tools: ToolConfig, think_open: bool = False) -> str:
    """The Lark grammar (llguidance) of the request's forced output, in its call format; with
    `think_open` (the prompt ends inside `<think>`), the think block's close first and whitespace
    after it: no reasoning text under the grammar. llama.cpp's grammars make the close optional
    (`( "</think>" space )?`), but an answer without it is all reasoning to the splitter here (and
    to llama.cpp's parser, which then finds no call): a random model skipped it, and lost its call."""
    try:
        grammar = GRAMMARS[tools.format](tools)
    except (TypeError, ValueError, AttributeError) as e:   # a parameter schema's keyword of the wrong kind
        raise bad_request(f"'tools': a function's parameters cannot make the {tools.format} call grammar: {e}") from None
    if not think_open:
        return grammar
    assert grammar.startswith("start: ")
    return 'start: "</think>" /\\n{0,2}/ answer\nanswer: ' + grammar[len("start: "):]   # (unbounded, a model can loop on newlines)
