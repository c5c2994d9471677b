"""Tool-call formats beyond Hermes, offline: which format a template gets (tool_formats.py), its
prompt against llama-server's /apply-template (tests/fixtures/tool_templates.json, made by
playground/make_tool_fixtures.py), the fallback prompts, and each format's parser, whole and
streamed (any chunking of a text gives what the whole text gives)."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slotserver.model.text.chat_template import CHATML_TEMPLATE, ChatTemplate
from slotserver.server.fields import Fields
from slotserver.server.tools.calls_json import call_parser
from slotserver.server.tools.formats import (GENERIC, GLM, GRANITE, HERMES, LFM2, LLAMA3, MISTRAL, QWEN_XML, SEED_XML,
                                             choose_format, native_format)
from slotserver.server.tools.prompt import nemo_id, render_with_tools
from slotserver.server.tools.request import parse_tools

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "tool_templates.json").read_text())
TEMPLATES = {c["name"]: c for c in FIXTURES["cases"]}
CASES = [(c["name"], i) for c in FIXTURES["cases"] for i in range(len(c["conversations"]))]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CALL_HISTORY = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_0f3a", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Lima\"}"}}]},
                {"role": "tool", "tool_call_id": "call_0f3a", "content": "sunny"}]


def template(name: str) -> ChatTemplate:
    return ChatTemplate(TEMPLATES[name]["source"], FIXTURES["bos_token"], FIXTURES["eos_token"], FIXTURES["add_bos"])


def tools(fmt: str = HERMES, **body) -> object:
    return dataclasses.replace(parse_tools(Fields({"tools": [WEATHER], **body})), format=fmt)


@pytest.mark.parametrize("name, fmt", [("llama3.1", LLAMA3), ("llama3.2", LLAMA3), ("llama3.3", LLAMA3),
                                       ("mistral-nemo", MISTRAL), ("qwen2.5", HERMES)])
def test_each_template_is_detected_as_its_family_format(name, fmt):
    source = TEMPLATES[name]["source"]
    assert native_format(source) == choose_format(source) == fmt
    assert choose_format(source, "generic") == GENERIC and choose_format(source, "hermes") == HERMES


XML = {c["name"]: c["source"] for c in json.loads((Path(__file__).parent / "fixtures" / "tool_templates_xml.json")
                                                   .read_text())["cases"]}


@pytest.mark.parametrize("name, fmt", [("qwen3.5", QWEN_XML), ("nemotron-3-nano", QWEN_XML), ("glm-4.7-flash", GLM),
                                       ("seed-oss", SEED_XML), ("lfm2", LFM2), ("lfm2.5", LFM2),
                                       ("granite-3.3", GRANITE)])
def test_the_xml_templates_are_detected_as_their_format(name, fmt):
    assert native_format(XML[name]) == choose_format(XML[name]) == fmt


def test_templates_without_tools_get_hermes_unless_told_and_lookalikes_are_not_misread():
    assert native_format(CHATML_TEMPLATE) is None and choose_format(CHATML_TEMPLATE) == HERMES
    assert choose_format(None) == HERMES and choose_format(CHATML_TEMPLATE, "generic") == GENERIC
    small = "{{ tools }}[TOOL_CALLS]{{ name }}[ARGS]{{ args }}"          # Mistral Small 3.2's form
    functionary = "<|start_header_id|>ipython<|end_header_id|>{{ tools }}<function="
    assert native_format(small) == native_format(functionary) == HERMES
    with pytest.raises(ValueError, match="tool-call format"):
        choose_format(CHATML_TEMPLATE, "xml")


@pytest.mark.parametrize("name, i", CASES)
def test_prompt_with_tools_and_calls_is_llama_servers(name, i):
    case = TEMPLATES[name]
    conv = case["conversations"][i]
    config = parse_tools(Fields({"tools": conv.get("tools", [])}), case["source"])
    assert render_with_tools(template(name), conv["messages"], config, variables=case["kwargs"]) == conv["prompt"]


def test_mistral_history_ids_become_nine_characters_shared_by_a_call_and_its_result():
    config = parse_tools(Fields({"tools": [WEATHER]}), TEMPLATES["mistral-nemo"]["source"])
    text = render_with_tools(template("mistral-nemo"), CALL_HISTORY, config)
    mapped = nemo_id("call_0f3a")
    assert len(mapped) == 9 and mapped.isalnum() and nemo_id("abcABC123") == "abcABC123"
    assert f'"id": "{mapped}"' in text and f'"call_id": "{mapped}"' in text


def test_llama3_history_tolerates_null_tool_calls_on_plain_answers():
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello", "tool_calls": None},
               {"role": "user", "content": "Bye"}]
    config = parse_tools(Fields({}), TEMPLATES["llama3.1"]["source"])
    assert "Hello<|eot_id|>" in render_with_tools(template("llama3.1"), history, config)


def test_generic_fallback_teaches_json_answers_and_writes_the_history_as_them():
    chatml = ChatTemplate(CHATML_TEMPLATE)
    history = [*CALL_HISTORY, {"role": "assistant", "content": "It is sunny."}, {"role": "user", "content": "Thanks"}]
    text = render_with_tools(chatml, history, tools(GENERIC))
    assert text.startswith("<|im_start|>system\nYou can call any of the following tools") and "`tool_call`" in text
    assert '<|im_start|>assistant\n{"tool_call": {"name": "get_weather", "arguments": {"city": "Lima"}}}' in text
    assert '<|im_start|>user\n{"tool_response": {"tool_call_id": "call_0f3a", "content": "sunny"}}' in text
    assert '<|im_start|>assistant\n{"response": "It is sunny."}<|im_end|>' in text
    assert "`tool_calls`" in render_with_tools(chatml, history, tools(GENERIC, parallel_tool_calls=True))
    prefill = render_with_tools(chatml, [*history, {"role": "assistant", "content": "Sure"}], tools(GENERIC),
                                add_generation_prompt=False, continue_final=True)
    assert prefill.endswith("<|im_start|>assistant\nSure")
    plain = render_with_tools(chatml, history, tools(GENERIC, tool_choice="none"))
    assert "You can call" not in plain and "assistant\nIt is sunny.<|im_end|>" in plain


def test_a_format_the_template_does_not_speak_gets_the_fallback_prompt():
    text = render_with_tools(template("llama3.1"), CALL_HISTORY, tools(HERMES), variables={"date_string": "x"})
    assert "# Tools" in text and '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima"}}' in text
    assert "ipython" not in text   # the result is a user turn in <tool_response>, not the template's own


WHOLE = [  # (format, text, content, [(name, arguments)])
    (LLAMA3, '{"name": "get_weather", "parameters": {"city": "Oslo"}}', "", [("get_weather", {"city": "Oslo"})]),
    (LLAMA3, ' <|python_tag|>{"type": "function", "name": "get_weather", "parameters": {}} ok', "ok",
     [("get_weather", {})]),
    (LLAMA3, 'Sure: {"name": "get_weather", "parameters": {}}', 'Sure: {"name": "get_weather", "parameters": {}}', []),
    (LLAMA3, '{"name": "get_weather", "parameters": {"ci', '{"name": "get_weather", "parameters": {"ci', []),
    (LLAMA3, '{"name": "nope", "parameters": {}}', '{"name": "nope", "parameters": {}}', []),
    (MISTRAL, 'Let me see.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "a]b"}, "id": "abcABC123"}]',
     "Let me see.", [("get_weather", {"city": "a]b"})]),
    (MISTRAL, '[{"name": "get_weather", "arguments": "{\\"city\\": \\"X\\"}"}]', "", [("get_weather", {"city": "X"})]),
    (MISTRAL, "[TOOL_CALLS] not json [1]", "[TOOL_CALLS] not json [1]", []),
    (MISTRAL, '[TOOL_CALLS][{"name": "nope", "arguments": {}}]', '[TOOL_CALLS][{"name": "nope", "arguments": {}}]', []),
    (GENERIC, '{"response": "Hi \\"you\\""}', 'Hi "you"', []),
    (GENERIC, '{"tool_call": {"name": "get_weather", "arguments": {"c": 1}}}', "", [("get_weather", {"c": 1})]),
    (GENERIC, '{"tool_calls": [{"name": "get_weather", "arguments": {}}]}', "", [("get_weather", {})]),
    (GENERIC, '{"answer": 1}', '{"answer": 1}', []),
    (GENERIC, "plain words", "plain words", []),
    (QWEN_XML, "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
               "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>", "Checking.",
     [("get_weather", {"city": "New York", "days": 3})]),
    (QWEN_XML, "<tool_call>\n<function=get_weather>\n<parameter=code>\na < b\n  c\n</parameter>\n</function>\n"
               "</tool_call>", "", [("get_weather", {"code": "a < b\n  c"})]),
    (QWEN_XML, "<tool_call>\n<function=nope>\n</function>\n</tool_call>",
     "<tool_call>\n<function=nope>\n</function>\n</tool_call>", []),
    (QWEN_XML, "<tool_call>\n<function=get_weather>\nstray\n</function>\n</tool_call>",
     "<tool_call>\n<function=get_weather>\nstray\n</function>\n</tool_call>", []),
    (QWEN_XML, "Sure.\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>", "Sure.",
     [("get_weather", {"city": "Paris"})]),   # Qwen3-Coder without its <tool_call> (llama.cpp takes it)
    (QWEN_XML, "<function=nope>\n</function>", "<function=nope>\n</function>", []),
    (QWEN_XML, "I will use <function=get_weather> now.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis"
               "\n</parameter>\n</function>\n</tool_call>", "I will use <function=get_weather> now.",
     [("get_weather", {"city": "Paris"})]),   # a bare opener in prose: text, the call after it still a call
    (QWEN_XML, "<function=get_weather>\n<parameter=city>\nPa", "<function=get_weather>\n<parameter=city>\nPa", []),
    (SEED_XML, "<seed:tool_call>\n<function=get_weather>\n<parameter=city>Oslo</parameter>\n</function>\n"
               "</seed:tool_call>", "", [("get_weather", {"city": "Oslo"})]),
    (GRANITE, 'Checking. <|tool_call|>[{"name": "get_weather", "arguments": {"city": "Oslo"}}]', "Checking.",
     [("get_weather", {"city": "Oslo"})]),
    (GRANITE, '[{"name": "get_weather", "arguments": {}}, {"name": "get_weather", "arguments": {"a": 1}}]', "",
     [("get_weather", {}), ("get_weather", {"a": 1})]),   # the marker a control token: the bare array
    (GRANITE, '<|tool_call|>[{"name": "nope", "arguments": {}}]', '<|tool_call|>[{"name": "nope", "arguments": {}}]',
     []),
    (LFM2, 'Sure. <|tool_call_start|>[get_weather(city="Paris", days=3)]<|tool_call_end|>', "Sure.",
     [("get_weather", {"city": "Paris", "days": 3})]),
    (LFM2, "<|tool_call_start|>[get_weather(city='Rome', ok=true, n=None), get_weather()]<|tool_call_end|>", "",
     [("get_weather", {"city": "Rome", "ok": True, "n": None}), ("get_weather", {})]),   # one block's calls: all
    (LFM2, '<|tool_call_start|>[get_weather("x")]<|tool_call_end|>', '<|tool_call_start|>[get_weather("x")]'
     '<|tool_call_end|>', []),
    (LFM2, '<|tool_call_start|>[__import__("os").system("x")]<|tool_call_end|>', '<|tool_call_start|>'
     '[__import__("os").system("x")]<|tool_call_end|>', []),   # nothing is evaluated: not a call
    (GLM, "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Lima</arg_value>\n</tool_call>", "",
     [("get_weather", {"city": "Lima"})]),
    (GLM, '<tool_call>get_weather<arg_key>q</arg_key><arg_value>{"a": [1]}</arg_value></tool_call>', "",
     [("get_weather", {"q": {"a": [1]}})]),
    (GLM, "<tool_call>get_weather<arg_key>a</arg_key><arg_value>1</arg_value><arg_key>a</arg_key><arg_value>2"
          "</arg_value></tool_call>", "<tool_call>get_weather<arg_key>a</arg_key><arg_value>1</arg_value><arg_key>a"
     "</arg_key><arg_value>2</arg_value></tool_call>", []),
]


def test_a_string_parameter_keeps_its_text_and_others_decode_as_json():
    """As the templates render arguments (a string as it is, anything else as JSON) and vLLM's and
    llama.cpp's parsers read them back: the schema's string parameters stay text."""
    typed = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "code": {"type": "string"}, "days": {"type": "integer"}, "tags": {"type": "array"}}}}}
    config = dataclasses.replace(parse_tools(Fields({"tools": [typed]})), format=QWEN_XML)
    text = ("<tool_call>\n<function=get_weather>\n<parameter=code>\n007\n</parameter>\n<parameter=days>\n7\n"
            "</parameter>\n<parameter=tags>\n[\"a\"]\n</parameter>\n</function>\n</tool_call>")
    assert _named(call_parser(config).parse(text)[1]) == [("get_weather", {"code": "007", "days": 7, "tags": ["a"]})]


def test_lfm2_names_and_keys_are_matched_as_written_and_values_must_be_json():
    """Tool names with a hyphen or a dot and argument names that are Python keywords (`from=`) are
    calls, as llama.cpp matches the offered names; a value JSON cannot carry (bytes, a set, a
    complex number, infinity) leaves the block content, never a failed answer."""
    named = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
             for n in ("get-weather", "Calendar.create_event", "convert")]
    config = dataclasses.replace(parse_tools(Fields({"tools": named, "parallel_tool_calls": True})), format=LFM2)
    text = ('<|tool_call_start|>[get-weather(city="a, b)"), Calendar.create_event(title=\'x\'), '
            'convert(from="USD", to="EUR", user-id=1)]<|tool_call_end|>')
    assert _named(call_parser(config).parse(text)[1]) == [
        ("get-weather", {"city": "a, b)"}), ("Calendar.create_event", {"title": "x"}),
        ("convert", {"from": "USD", "to": "EUR", "user-id": 1})]
    for value in ('b"x"', "{1, 2}", "1+2j", "1e999", "0x" + "f" * 5000):
        block = f"<|tool_call_start|>[convert(a={value})]<|tool_call_end|>"
        assert call_parser(config).parse(block) == (block, [])


@pytest.mark.parametrize("text, schema, value", [
    ("hello", {"type": ["string", "null"]}, "hello"), ("null", {"type": ["string", "null"]}, None),
    ("42", {"anyOf": [{"type": "string"}, {"type": "null"}]}, "42"),   # Pydantic's Optional[str]
    ("42", {"anyOf": [{"type": "integer"}, {"type": "null"}]}, 42),
    ("True", {"type": "boolean"}, True), ("None", {"type": ["integer", "null"]}, None),   # Jinja's |string
    ("True", {"type": "string"}, "True"), ("3", {"type": "number"}, 3), ("2", {"enum": [1, 2]}, 2),
    ("c", {"enum": ["c", "f"]}, "c"), ("x", {"type": "integer"}, "x"), ("3", {}, 3), ('"q"', {}, '"q"'),
])
def test_a_value_takes_the_types_its_schema_allows(text, schema, value):
    """calls_xml.typed_value, as llama.cpp's parsers read a parameter: its JSON value where that
    has an allowed type, else its text where a string is allowed."""
    from slotserver.server.tools.calls_xml import typed_value
    got = typed_value(text, schema)
    assert got == value and type(got) is type(value)


def _named(calls: list[dict]) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


@pytest.mark.parametrize("fmt, text, content, calls", WHOLE)
def test_whole_answers_parse_and_what_is_not_a_call_stays_content(fmt, text, content, calls):
    got_content, got = call_parser(tools(fmt)).parse(text)
    assert (got_content, _named(got)) == (content, calls)
    assert all(c["type"] == "function" and c["id"] for c in got)


@pytest.mark.parametrize("fmt, text, content, calls", WHOLE)
def test_fed_a_character_at_a_time_every_answer_parses_as_the_whole(fmt, text, content, calls):
    parser, sent = call_parser(tools(fmt)), []
    for ch in text:
        sent.append(parser.feed(ch)[0])
    sent.append(parser.feed("", final=True)[0])
    assert ("".join(sent).strip() if calls else "".join(sent), _named(parser.calls)) == (content, calls)


def test_mistral_keeps_the_models_ids_and_makes_nine_character_ones_otherwise():
    text = ('[TOOL_CALLS][{"name": "get_weather", "arguments": {}, "id": "abcABC123"}, '
            '{"name": "get_weather", "arguments": {}, "id": "call_1"}]')
    first, second = call_parser(tools(MISTRAL)).parse(text)[1]
    assert first["id"] == "abcABC123" and len(second["id"]) == 9 and second["id"].isalnum()


def test_without_parallel_calls_only_the_first_block_is_a_call():
    block = '[TOOL_CALLS][{"name": "get_weather", "arguments": {}}]'
    content, calls = call_parser(tools(MISTRAL)).parse(block + block)
    assert content == block and len(calls) == 1
    assert len(call_parser(tools(MISTRAL, parallel_tool_calls=True)).parse(block + block)[1]) == 2
    call = '{"name": "get_weather", "parameters": {}}'
    assert call_parser(tools(LLAMA3, parallel_tool_calls=True)).parse(call + call)[0] == call


# How an answer may begin (blocks whole, split inside their marker or JSON, near misses), then
# pieces in any order.
STARTS = {
    HERMES: ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "P"}}\n</tool_call>', "<tool",
             "\n<tool_call>", "text", ""],
    LLAMA3: ['{"name": "get_weather", "parameters": {"city": "]"}}', "<|py", "<|python_tag|>", '{"na', " ", "",
             '{"name": "nope", "parameters": {}}', "Hi", "[", "{"],
    MISTRAL: ['[TOOL_CALLS][{"name": "get_weather", "arguments": {}}]', "[TOOL_", "[", '[{"', " ", "", "text",
              '[{"name": "get_weather", "arguments": {"city": "}\\""}}]'],
    GENERIC: ['{"response": "a}b"}', '{"tool_call": {"name": "get_weather", "arguments": {}}}', '{"', " ", "",
              '{"tool_calls": [{"name": "get_weather", "arguments": {}}]}', "text", "{"],
    QWEN_XML: ["<tool_call>\n<function=get_weather>\n<parameter=city>\nP\n</parameter>\n</function>\n</tool_call>",
               "<tool", "<tool_call>\n<function=", "text", ""],
    GLM: ["<tool_call>get_weather<arg_key>city</arg_key><arg_value>P</arg_value></tool_call>", "<tool_call>get",
          "text", ""],
    SEED_XML: ["<seed:tool_call>\n<function=get_weather>\n<parameter=city>P</parameter>\n</function>\n"
               "</seed:tool_call>", "<seed:", "text", ""],
    LFM2: ['<|tool_call_start|>[get_weather(city="P")]<|tool_call_end|>', "<|tool_", "text", ""],
    GRANITE: ['<|tool_call|>[{"name": "get_weather", "arguments": {}}]', "<|tool", '[{"', "text", "", " "],
}
PIECES = {
    HERMES: ['<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>', "<tool_call>", "\n",
             '{"name": "get_weather", "arguments": {}}', "</tool_call>", "_call>", "text", " ", "{", '"'],
    LLAMA3: ['{"name": "get_weather", "parameters": {}}', 'thon_tag|>{"name": "get_weather", "parameters": {}}',
             'me": "get_weather", "parameters": {}}', "thon_tag|>", " ", "\n", "}", '"', '\\"', "x"],
    MISTRAL: ['[TOOL_CALLS][{"name": "get_weather", "arguments": {}}]', "[TOOL_CALLS]", "[TOOL_", "CALLS]",
              'CALLS][{"name": "get_weather", "arguments": {}}]', '{"name": "get_weather", "id": "abcABC123"}', "[",
              "]", "{", "}", '"', "\\", " ", "text"],
    GENERIC: ['{"tool_call": {"name": "get_weather", "arguments": {}}}', '{"', "{", "}", '"', "response", '": "',
              "text", " "],
    QWEN_XML: ["<tool_call>\n<function=get_weather>\n</function>\n</tool_call>", "<tool_call>", "</tool_call>",
               "<function=get_weather>", "</function>", "<parameter=a>", "</parameter>", "\n", "1", "text", "<",
               "<function=get_weather>\n<parameter=a>\n1\n</parameter>\n</function>", "<function="],
    GLM: ["<tool_call>get_weather</tool_call>", "<tool_call>", "</tool_call>", "get_weather", "<arg_key>a</arg_key>",
          "<arg_value>1</arg_value>", "<arg_value>", "\n", "x", "<"],
    SEED_XML: ["<seed:tool_call>\n<function=get_weather>\n</function>\n</seed:tool_call>", "<seed:tool_call>",
               "</seed:tool_call>", "<function=get_weather>", "<parameter=a>1</parameter>", "\n", "<"],
    LFM2: ["<|tool_call_start|>[get_weather()]<|tool_call_end|>", "<|tool_call_start|>", "<|tool_call_end|>", "[",
           "]", "get_weather(", "a=1", ")", ", ", "'", '"', "text"],
    GRANITE: ['<|tool_call|>[{"name": "get_weather", "arguments": {}}]', "<|tool_call|>", "<|tool_", "call|>", "[",
              "]", "{", "}", '"', " ", "text"],
}


@settings(max_examples=600, deadline=None, derandomize=True, database=None)
@given(data=st.data(), fmt=st.sampled_from(sorted(PIECES)), parallel=st.booleans(),
       cuts=st.lists(st.integers(0, 300), max_size=10), at_pieces=st.booleans())
def test_any_chunking_of_a_streamed_answer_gives_what_the_whole_answer_gives(data, fmt, parallel, cuts, at_pieces):
    pieces = [data.draw(st.sampled_from(STARTS[fmt])), *data.draw(st.lists(st.sampled_from(PIECES[fmt]), max_size=10))]
    text = "".join(pieces)
    whole_parser = call_parser(tools(fmt, parallel_tool_calls=parallel))
    whole_content, whole_calls = whole_parser.feed(text, final=True)
    if at_pieces:   # a cut between every two pieces (inside markers split in two pieces, say)
        cuts = [*cuts, *itertools.accumulate(len(p) for p in pieces)]
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    parser, content, calls = call_parser(tools(fmt, parallel_tool_calls=parallel)), [], []
    for a, b in itertools.pairwise(bounds):
        piece, new = parser.feed(text[a:b])
        content.append(piece)
        calls += new
    piece, new = parser.feed("", final=True)
    assert "".join(content) + piece == whole_content
    assert _named(calls + new) == _named(whole_calls) == _named(parser.calls)
