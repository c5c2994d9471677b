"""Function calling: OpenAI `tools`, `tool_choice`, `parallel_tool_calls`, end to end through HTTP
on the default model in the OpenAI SDK's shapes, and the parts (prompt rendering, the Hermes
`<tool_call>` parser, streamed deltas) on their own."""

from __future__ import annotations

import json

import pytest
from openai import OpenAI

from slotserver.model.text.chat_template import CHATML_TEMPLATE, ChatTemplate
from slotserver.server.fields import Fields
from slotserver.server.tools.calls import HermesParser
from slotserver.server.tools.prompt import render_with_tools
from slotserver.server.tools.request import parse_tools
from smollm_server import smollm_client

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "required": ["city"], "additionalProperties": False,
                   "properties": {"city": {"type": "string", "maxLength": 40},
                                  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a time zone",
    "parameters": {"type": "object", "required": ["zone"], "properties": {"zone": {"type": "string", "maxLength": 40}}}}}
ASK = [{"role": "user", "content": "What is the weather like in Paris?"}]


@pytest.fixture(scope="module")
def client():
    with smollm_client() as (c, _):
        yield c


@pytest.fixture(scope="module")
def oai(client):
    return OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client)


def _weather_args(call) -> dict:
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert isinstance(args["city"], str) and set(args) <= {"city", "unit"}
    return args


def test_required_tool_choice_returns_a_valid_call_every_time(oai):
    """Four seeded samples at temperature 1 (choice j draws with seed j), decoded side by side."""
    r = oai.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                    seed=0, temperature=1.0, max_tokens=100, n=4)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert len(choice.message.tool_calls) == 1
        call = choice.message.tool_calls[0]
        assert call.function.name in ("get_weather", "get_time")
        if call.function.name == "get_weather":
            _weather_args(call)


def test_named_tool_choice_calls_that_function(oai):
    r = oai.chat.completions.create(model="m", messages=ASK, tools=[TIME, WEATHER], temperature=0, max_tokens=100,
                                    tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert _weather_args(r.choices[0].message.tool_calls[0])["city"] == "Paris"


def test_parallel_tool_calls_are_each_valid(oai):
    r = oai.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], tool_choice="required", seed=5,
                                    parallel_tool_calls=True, temperature=0.7, max_tokens=150)
    calls = r.choices[0].message.tool_calls
    assert calls and len({c.id for c in calls}) == len(calls)
    for c in calls:
        _weather_args(c)


def test_streamed_tool_call_deltas_rebuild_the_same_call(oai):
    kw = dict(model="m", messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=100)
    whole = oai.chat.completions.create(**kw).choices[0].message.tool_calls[0]
    name, args, ids, finish = "", "", set(), None
    for chunk in oai.chat.completions.create(**kw, stream=True):
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for d in choice.delta.tool_calls or []:
            assert d.index == 0
            ids |= {d.id} if d.id else set()
            name += d.function.name or ""
            args += d.function.arguments or ""
    assert finish == "tool_calls" and len(ids) == 1
    assert name == whole.function.name and json.loads(args) == json.loads(whole.function.arguments)


def test_tool_choice_none_and_history_round_trip(client):
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"}]
    for choice in ("none", "auto"):
        r = client.post("/v1/chat/completions", json={"messages": history, "tools": [WEATHER], "tool_choice": choice,
                                                      "temperature": 0, "max_tokens": 8})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize("body, word", [
    ({"tools": "x"}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [WEATHER, WEATHER]}, "more than once"),
    ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format"),
])
def test_bad_tool_requests_are_400_naming_the_field(client, body, word):
    r = client.post("/v1/chat/completions", json={"messages": ASK, **body})
    assert r.status_code == 400 and word in r.json()["error"]["message"]


def _tools(**body):
    return parse_tools(Fields({"tools": [WEATHER, TIME], **body}))


def test_chatml_fallback_describes_tools_and_writes_history_in_hermes_form():
    tmpl = ChatTemplate(CHATML_TEMPLATE)
    history = [{"role": "system", "content": "Be brief."}, *ASK,
               {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {
                   "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
               {"role": "tool", "tool_call_id": "c", "content": "sunny"}]
    text = render_with_tools(tmpl, history, _tools())
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools") and '"name": "get_time"' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>" in text
    assert "# Tools" not in render_with_tools(tmpl, history, _tools(tool_choice="none"))


def test_a_template_with_tool_support_gets_tools_and_object_arguments():
    tmpl = ChatTemplate("{% for t in tools %}[{{ t.function.name }}]{% endfor %}{% for m in messages %}"
                        "{% for c in m.tool_calls or [] %}{{ c.function.arguments.city }}{% endfor %}{% endfor %}")
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "get_weather", "arguments": "{\"city\": \"Lima\"}"}}]}]
    assert render_with_tools(tmpl, history, _tools()) == "[get_weather][get_time]Lima"


def test_auto_parser_keeps_what_is_not_a_call_and_streams_like_the_whole():
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    content, calls = HermesParser(_tools()).parse(text)
    assert content == "Let me check." and json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}
    for broken in ('<tool_call>\n{"name": "get_weather", "arguments": {"ci\n</tool_call>',
                   '<tool_call>\n{"name": "unknown", "arguments": {}}\n</tool_call>', "a < b <tool"):
        assert HermesParser(_tools()).parse(broken) == (broken, [])
    p, sent, got = HermesParser(_tools()), [], []
    for ch in text + " and more":
        c, new = p.feed(ch)
        sent.append(c)
        got += new
    c, new = p.feed("", final=True)
    assert "".join(sent) + c == "Let me check.\n and more" and len(got + new) == 1
    two = text + "\n" + text
    assert len(HermesParser(_tools()).parse(two)[1]) == 1
    assert len(HermesParser(_tools(parallel_tool_calls=True)).parse(two)[1]) == 2
