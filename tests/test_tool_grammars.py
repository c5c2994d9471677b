"""The forced tool-call grammars of the XML and Python-style formats (server/tools/grammar.py), through
llguidance on the default model's vocabulary: each takes the call texts its format's parser reads
as the offered calls, and refuses calls the schemas rule out (a missing required argument, a value
of the wrong type, a function not offered, an argument twice or out of order, a second call without
parallel_tool_calls). What a user sees: `tool_choice` "required" can only produce such calls."""

from __future__ import annotations

import dataclasses

import pytest

from slotserver.engine.grammar import Grammars, compile_constraint
from slotserver.model.default_model import default_model_path
from slotserver.model.gguf_file import GGUFFile
from slotserver.model.text.tokenizer import Tokenizer
from slotserver.server.fields import Fields
from slotserver.server.tools.calls_json import call_parser
from slotserver.server.tools.grammar import forced_call_grammar
from slotserver.server.tools.request import parse_tools

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "required": ["days"],
           "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["c", "f"]}}}}}
PING = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object"}}}
GOOD = {   # format -> texts the grammar takes (with parallel calls)
    "qwen3_coder": ["<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Jose\n</parameter>\n<parameter=days>\n3\n"
                    "</parameter>\n</function>\n</tool_call>",
                    "<tool_call>\n<function=ping>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
                    "<parameter=days>\n1\n</parameter>\n<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>"],
    "seed_oss": ["<seed:tool_call>\n<function=get_weather>\n<parameter=days>2</parameter>\n</function>\n</seed:tool_call>"],
    "glm": ["<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value><arg_key>days</arg_key>"
            "<arg_value>2</arg_value></tool_call>"],
    "lfm2": ['<|tool_call_start|>[get_weather(city="Oslo", days=2)]<|tool_call_end|>',
             '<|tool_call_start|>[ping(), get_weather(days=1, unit="f")]<|tool_call_end|>'],
}
BAD = {   # format -> texts the grammar refuses
    "qwen3_coder": ["<tool_call>\n<function=get_weather>\n<parameter=city>\nX\n</parameter>\n</function>\n</tool_call>",
                    "<tool_call>\n<function=get_weather>\n<parameter=days>\nmany\n</parameter>\n</function>\n</tool_call>",
                    "<tool_call>\n<function=nope>\n</function>\n</tool_call>"],
    "seed_oss": ["<seed:tool_call>\n<function=get_weather>\n<parameter=unit>k</parameter>\n</function>\n</seed:tool_call>"],
    "glm": ["<tool_call>get_weather<arg_key>days</arg_key><arg_value>2</arg_value><arg_key>city</arg_key>"
            "<arg_value>Rome</arg_value></tool_call>"],
    "lfm2": ['<|tool_call_start|>[get_weather(days=2, city="Oslo")]<|tool_call_end|>',
             '<|tool_call_start|>[get_weather(days=2, days=3)]<|tool_call_end|>',
             '<|tool_call_start|>[get_weather(city="Oslo")]<|tool_call_end|>',
             '<|tool_call_start|>[get_weather("Oslo", days=2)]<|tool_call_end|>'],
}


@pytest.fixture(scope="module")
def grammars() -> Grammars:
    return Grammars(Tokenizer.from_metadata(GGUFFile.open(default_model_path()).metadata))


def _tools(fmt: str, parallel: bool = True):
    return dataclasses.replace(parse_tools(Fields({"tools": [WEATHER, PING], "tool_choice": "required",
                                                   "parallel_tool_calls": parallel})), format=fmt)


def _takes(grammars: Grammars, grammar: str, text: str) -> bool:
    matcher = grammars.matcher(compile_constraint("lark", grammar))
    return matcher.consume_tokens(grammars.tokenizer.encode(text, add_special=False)) and matcher.is_accepting()


@pytest.mark.parametrize("fmt", sorted(GOOD))
def test_the_grammar_takes_the_calls_its_parser_reads(grammars, fmt):
    grammar = forced_call_grammar(_tools(fmt))
    for text in GOOD[fmt]:
        assert _takes(grammars, grammar, text), text
        content, calls = call_parser(_tools(fmt)).parse(text)
        assert content == "" and calls and all(c["function"]["name"] in ("get_weather", "ping") for c in calls)


@pytest.mark.parametrize("fmt", sorted(BAD))
def test_the_grammar_refuses_calls_the_schemas_rule_out(grammars, fmt):
    grammar = forced_call_grammar(_tools(fmt))
    for text in BAD[fmt]:
        assert not _takes(grammars, grammar, text), text


def test_an_lfm2_call_of_a_hyphenated_name_with_a_keyword_argument_parses_back(grammars):
    """What the grammar lets the model write, the parser reads: names and keys as written."""
    tool = {"type": "function", "function": {"name": "fx-rate", "parameters": {"type": "object", "required": ["from"],
            "properties": {"from": {"type": "string"}}}}}
    config = dataclasses.replace(parse_tools(Fields({"tools": [tool], "tool_choice": "required"})), format="lfm2")
    text = '<|tool_call_start|>[fx-rate(from="USD")]<|tool_call_end|>'
    assert _takes(grammars, forced_call_grammar(config), text)
    assert [c["function"]["name"] for c in call_parser(config).parse(text)[1]] == ["fx-rate"]


@pytest.mark.parametrize("fmt", ["qwen3_coder", "lfm2"])
def test_without_parallel_calls_the_grammar_takes_one_call(grammars, fmt):
    two = GOOD[fmt][1]
    assert _takes(grammars, forced_call_grammar(_tools(fmt)), two)
    assert not _takes(grammars, forced_call_grammar(_tools(fmt, parallel=False)), two)
