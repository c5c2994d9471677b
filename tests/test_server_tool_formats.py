"""Forced tool calls in every format, through HTTP on the tiny random model: the chat template
(`--chat-template`: Llama 3.1's, Mistral Nemo's, ChatML) or `--tool-call-format` picks the
format, the grammar forces a call, and the answer parses back into OpenAI `tool_calls` that match
their function's schema, whole and streamed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from test_server_api import sse_events
from tiny_engine import running_tiny_engine

from slotserver.model.config import ConfigError
from slotserver.model.text.chat_template import CHATML_TEMPLATE, ChatTemplate
from slotserver.server import ServerConfig, ServerState, create_app
from slotserver.server.chat_options import chat_defaults_from_flags

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "tool_templates.json").read_text())
XML = json.loads((Path(__file__).parent / "fixtures" / "tool_templates_xml.json").read_text())   # calls_xml.py's
SOURCES = {c["name"]: c["source"] for c in FIXTURES["cases"] + XML["cases"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "required": ["city"], "additionalProperties": False,
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"type": "string", "enum": ["c", "f"]}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "required": ["zone"], "additionalProperties": False,
    "properties": {"zone": {"type": "string", "maxLength": 12}}}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
# the XML formats' markers and tags take many of the tiny vocabulary's tokens (a call ~90-130 of them)
MAX_TOKENS = {"qwen3_coder": 300, "glm": 300, "seed_oss": 300, "lfm2": 300}
# (template, --tool-call-format): each format the template gets
SETUPS = {"llama3": ("llama3.1", "auto"), "mistral": ("mistral-nemo", "auto"), "hermes": ("chatml", "auto"),
          "generic": ("chatml", "generic"), "qwen3_coder": ("qwen3.5", "auto"), "glm": ("glm-4.7-flash", "auto"),
          "seed_oss": ("seed-oss", "auto"), "lfm2": ("lfm2", "auto"), "granite": ("granite-3.3", "auto")}


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    with running_tiny_engine(tmp_path_factory.mktemp("tiny"), 1, 4096, **{"llama.context_length": 4096}) as running:
        yield running


@pytest.fixture(scope="module")
def clients(tiny_engine):
    bundle, engine = tiny_engine
    out = {}
    for fmt, (name, flag) in SETUPS.items():
        config = ServerConfig(model_path=str(bundle.config.model_path), chat=chat_defaults_from_flags(tool_format=flag))
        state = ServerState(config)
        state.set_loaded(bundle, engine, ChatTemplate(SOURCES.get(name, CHATML_TEMPLATE)))
        out[fmt] = TestClient(create_app(state))
    return out


def _valid(schema: dict, value: object) -> bool:
    """The few JSON Schema words these tools use."""
    if schema.get("type") == "string":
        return isinstance(value, str) and len(value) <= schema.get("maxLength", len(value)) and \
            value in schema.get("enum", [value])
    props = schema.get("properties", {})
    return (isinstance(value, dict) and set(schema.get("required", [])) <= set(value)
            and (schema.get("additionalProperties", True) or set(value) <= set(props))
            and all(_valid(props[k], v) for k, v in value.items() if k in props))


def _check_call(call: dict, fmt: str) -> tuple[str, dict]:
    fn = {"get_weather": WEATHER, "get_time": TIME}[call["function"]["name"]]["function"]
    args = json.loads(call["function"]["arguments"])
    assert call["type"] == "function" and _valid(fn["parameters"], args), call
    if fmt == "mistral":   # the model's own id, in the form Nemo's template takes back
        assert len(call["id"]) == 9 and call["id"].isalnum()
    return call["function"]["name"], args


def chat(client, **body) -> dict:
    r = client.post("/v1/chat/completions", json={"messages": ASK, "tools": [WEATHER, TIME], "temperature": 0,
                                                  "max_tokens": 120, **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


@pytest.mark.parametrize("fmt", sorted(SETUPS))
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_a_forced_call_parses_and_matches_its_schema(clients, fmt, choice):
    for seed in (0, 1):
        answer = chat(clients[fmt], tool_choice=choice, seed=seed, temperature=1.0, max_tokens=MAX_TOKENS.get(fmt, 120))
        assert answer["finish_reason"] == "tool_calls" and answer["message"]["content"] is None
        calls = answer["message"]["tool_calls"]
        assert len(calls) == 1
        name, _ = _check_call(calls[0], fmt)
        assert isinstance(choice, str) or name == "get_time"


@pytest.mark.parametrize("fmt", ["mistral", "generic", "hermes", "qwen3_coder", "glm", "granite"])   # lfm2's list goes on
def test_parallel_forced_calls_are_each_valid(clients, fmt):   # past 300 tokens here: test_tool_grammars.py
    """The random model may add calls until max_tokens: what is left of an unclosed block is
    content, and such an answer finishes with "length"."""
    finished = 0
    for seed in range(4):
        answer = chat(clients[fmt], tool_choice="required", parallel_tool_calls=True, seed=seed, temperature=0.8,
                      max_tokens=MAX_TOKENS.get(fmt, 120))
        calls = answer["message"].get("tool_calls") or []
        assert answer["finish_reason"] == "length" or (answer["finish_reason"] == "tool_calls" and calls)
        finished += answer["finish_reason"] == "tool_calls"
        for call in calls:
            _check_call(call, fmt)
    assert finished


@pytest.mark.parametrize("fmt", sorted(SETUPS))
def test_streamed_deltas_rebuild_the_whole_answers_call(clients, fmt):
    whole = chat(clients[fmt], tool_choice="required", max_tokens=MAX_TOKENS.get(fmt, 120))["message"]["tool_calls"][0]
    body = {"messages": ASK, "tools": [WEATHER, TIME], "tool_choice": "required", "temperature": 0,
            "max_tokens": MAX_TOKENS.get(fmt, 120), "stream": True}
    events = sse_events(clients[fmt].post("/v1/chat/completions", json=body).text)
    chunks = [json.loads(e)["choices"][0] for e in events[:-1] if json.loads(e)["choices"]]
    deltas = [t for c in chunks for t in c["delta"].get("tool_calls") or []]
    assert chunks[-1]["finish_reason"] == "tool_calls" and {d["index"] for d in deltas} == {0}
    name = "".join(d["function"].get("name") or "" for d in deltas)
    args = "".join(d["function"].get("arguments") or "" for d in deltas)
    assert (name, json.loads(args)) == (whole["function"]["name"], json.loads(whole["function"]["arguments"]))
    assert "".join(c["delta"].get("content") or "" for c in chunks) == ""


def test_generic_answers_always_go_through_its_grammar_and_stream_as_they_parse(clients):
    body = {"tools": [WEATHER], "max_tokens": 40}
    answer = chat(clients["generic"], **body)
    message = answer["message"]
    if answer["finish_reason"] == "tool_calls":
        _check_call(message["tool_calls"][0], "generic")
    elif answer["finish_reason"] == "stop":   # the grammar closed a {"response": ...}: its text
        assert not message["content"].startswith('{"response"')
    events = sse_events(clients["generic"].post("/v1/chat/completions", json={
        "messages": ASK, "temperature": 0, "stream": True, **body}).text)
    chunks = [json.loads(e)["choices"][0] for e in events[:-1] if json.loads(e)["choices"]]
    assert "".join(c["delta"].get("content") or "" for c in chunks) == (message["content"] or "")


def test_apply_template_uses_the_templates_own_format(clients):
    prompts = {fmt: clients[fmt].post("/apply-template", json={"messages": ASK, "tools": [WEATHER]}).json()["prompt"]
               for fmt in SETUPS}
    assert "[AVAILABLE_TOOLS]" in prompts["mistral"] and "Environment: ipython" in prompts["llama3"]
    assert "<tool_call>" in prompts["hermes"] and '{"response": "..."}' in prompts["generic"]
    assert "<parameter=example_parameter_1>" in prompts["qwen3_coder"] and "<arg_key>" in prompts["glm"]


NOTE = {"type": "function", "function": {"name": "note", "parameters": {"type": "object", "required": ["text"],
        "properties": {"text": {"type": ["string", "null"], "maxLength": 8}}}}}   # (an integer: the random
#                                                                   model writes digits until max_tokens)


@pytest.mark.parametrize("fmt", ["qwen3_coder", "glm", "seed_oss"])
def test_a_forced_nullable_string_is_text_or_null_never_quoted(clients, fmt):
    """A `["string", "null"]` parameter (OpenAI strict mode's, Pydantic's optional fields) is written
    as raw text under the grammar and read back as that text, or as null: never a JSON string's quotes."""
    for seed in range(3):
        r = clients[fmt].post("/v1/chat/completions", json={"messages": ASK, "tools": [NOTE], "tool_choice": "required",
                                                             "temperature": 1.0, "seed": seed, "max_tokens": 300})
        args = json.loads(r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])
        assert args["text"] is None or (isinstance(args["text"], str) and not args["text"].startswith('"'))


@pytest.mark.parametrize("fmt", ["qwen3_coder", "glm"])
def test_a_schema_keyword_of_the_wrong_kind_is_a_400_naming_tools(clients, fmt):
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
           "properties": {"a": {"type": "string", "minLength": "abc"}}}}}
    r = clients[fmt].post("/v1/chat/completions", json={"messages": ASK, "tools": [bad], "tool_choice": "required"})
    assert r.status_code == 400 and "tools" in r.json()["error"]["message"]


@pytest.mark.parametrize("fmt", ["qwen3_coder", "glm", "seed_oss"])
def test_a_call_in_the_history_renders_in_the_templates_form_and_parses_back(clients, fmt):
    """An OpenAI client sends a past call's arguments as a JSON string; these templates iterate them
    as an object (llama.cpp's supports_object_arguments: decoded first, as there, where the template
    failed before). The call the prompt shows parses back, in the format's parser, into that call."""
    from slotserver.server.tools.calls_json import call_parser
    from slotserver.server.tools.request import ToolConfig

    args = {"city": "Paris", "unit": "c", "days": 3, "hourly": True, "note": None}   # |string: True, None
    typed = {**WEATHER["function"], "parameters": {**WEATHER["function"]["parameters"], "additionalProperties": True,
             "properties": {**WEATHER["function"]["parameters"]["properties"], "days": {"type": "integer"},
                            "hourly": {"type": "boolean"}, "note": {"type": ["string", "null"]}}}}
    history = ASK + [{"role": "assistant", "content": "", "tool_calls": [{"id": "call00001", "type": "function",
                     "function": {"name": "get_weather", "arguments": json.dumps(args)}}]},
                     {"role": "tool", "tool_call_id": "call00001", "content": "sunny"}]
    tool = {"type": "function", "function": typed}
    r = clients[fmt].post("/apply-template", json={"messages": history, "tools": [tool]})
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt"]
    marker = "<seed:tool_call>" if fmt == "seed_oss" else "<tool_call>"
    close = marker.replace("<", "</")
    block = prompt[prompt.rindex(marker): prompt.index(close, prompt.rindex(marker)) + len(close)]
    _, calls = call_parser(ToolConfig((tool,), "auto", format=fmt)).parse(block)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("get_weather", args)]


def test_an_unknown_tool_call_format_is_a_config_error():
    with pytest.raises(ConfigError, match="--tool-call-format"):
        chat_defaults_from_flags(tool_format="xml")
