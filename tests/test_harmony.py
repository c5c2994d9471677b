"""gpt-oss's harmony format (server/harmony.py, server/answer.py): llama.cpp's own parser cases.

CASES are the "GPT-OSS format tests" of llama.cpp's tests/test-chat.cpp (vendored llama.cpp of
llama_cpp_python 0.3.36), inputs and expected messages copied as they are there: the model's output
after the generation prompt `<|start|>assistant`, the reasoning format, the offered tools, and the
expected reasoning_content / content / tool calls. Each is checked whole and streamed (every
one-character split, and the pieces a real stream of tokens would give), where the deltas must add
up to the whole answer's split, as test-chat.cpp's streaming check demands.
The two continuation cases differ from llama.cpp by design: slotserver's answer to a continued
message holds only the generated text (as for every format here), so the prefilled "Hello, " and
"I'm" are not repeated.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from slotserver.model.text.chat_template import ChatTemplate
from slotserver.server.answer import answer_parser
from slotserver.server.chat_options import ChatDefaults
from slotserver.server.fields import Fields
from slotserver.server.harmony import HarmonyParser, answer_prefix, in_analysis, template_is_harmony
from slotserver.server.openai_params import render_chat_request
from slotserver.server.reasoning import ReasoningMode
from slotserver.server.tools.prompt import render_with_tools
from slotserver.server.tools.formats import HARMONY, HERMES, choose_format
from slotserver.server.tools.request import ToolConfig, parse_tools

HELLO, THINKING = "Hello, world!\nWhat's up?", "I'm\nthinking"
SPECIAL = {"type": "function", "function": {"name": "special_function", "description": "I'm special", "parameters": {
    "type": "object", "properties": {"arg1": {"type": "integer", "description": "The arg."}}, "required": ["arg1"]}}}
EDIT = {"type": "function", "function": {"name": "edit", "description": "Edit a file", "parameters": {
    "type": "object", "properties": {"oldString": {"type": "string"}, "newString": {"type": "string"},
                                     "replaceAll": {"type": "boolean"}}, "required": ["oldString", "newString"]}}}
CALL = ("special_function", {"arg1": 1})
EDIT_ARGS = {"oldString": "if (part < railCount - 1) {", "newString": "if (part < 4) {", "replaceAll": False}

# (output, reasoning_format, tools, expected reasoning, expected content, expected calls [(name, args)])
CASES = {
    "final channel": ("<|channel|>final<|message|>" + HELLO, "auto", [], "", HELLO, []),
    "commentary channel": ("<|channel|>commentary<|message|>" + HELLO, "auto", [], "", HELLO, []),
    "analysis then final": ("<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final"
                            "<|message|>" + HELLO, "auto", [], THINKING, HELLO, []),
    "analysis then final, reasoning_format none": (
        "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>" + HELLO,
        "none", [], "", "<|channel|>analysis<|message|>I'm\nthinking<|end|>" + HELLO, []),
    "recipient in role": (" to=functions.special_function<|channel|>analysis<|message|>{\"arg1\": 1}",
                          "auto", [SPECIAL], "", "", [CALL]),
    "recipient in channel": ("<|channel|>analysis to=functions.special_function<|message|>{\"arg1\": 1}",
                             "auto", [SPECIAL], "", "", [CALL]),
    "constraint": (" to=functions.special_function<|channel|>analysis <|constrain|>json<|message|>{\"arg1\": 1}",
                   "auto", [SPECIAL], "", "", [CALL]),
    "commentary call": ("<|channel|>commentary to=functions.special_function<|message|>{\"arg1\": 1}",
                        "auto", [SPECIAL], "", "", [CALL]),
    "reasoning then call": ("<|channel|>analysis<|message|>I'm\nthinking<|end|>"
                            "<|start|>assistant to=functions.special_function<|channel|>analysis<|message|>{\"arg1\": 1}",
                            "auto", [SPECIAL], THINKING, "", [CALL]),
    "complex call": ("<|channel|>analysis<|message|>Thinking about edit...<|end|>"
                     "<|start|>assistant<|channel|>commentary to=functions.edit <|constrain|>json"
                     "<|message|>" + json.dumps(EDIT_ARGS), "auto", [EDIT], "Thinking about edit...", "",
                     [("edit", EDIT_ARGS)]),
    "structured output": ("<|channel|>analysis<|message|>I need to output the invoice details in JSON<|end|>"
                          "<|start|>assistant<|channel|>final <|constrain|>json<|message|>"
                          '{"amount": 123.45, "date": "2025-12-03"}', "auto", [],
                          "I need to output the invoice details in JSON", '{"amount": 123.45, "date": "2025-12-03"}', []),
    "unsolicited builtin, recipient in role": (
        "<|channel|>analysis<|message|>I will execute python to say hello<|end|>"
        "<|start|>assistant to=container.exec<|channel|>commentary<|message|>python3 -c 'print(\"hello\")'",
        "auto", [], "I will execute python to say hello", "", []),
    "unsolicited builtin, recipient in channel": (
        "<|channel|>analysis<|message|>I will execute python to say hello<|end|>"
        "<|start|>assistant<|channel|>commentary to=python <|constrain|>code<|message|>print(\"hello\")",
        "auto", [], "I will execute python to say hello", "", []),
    "stray commentary before reasoning": (
        "<|channel|>commentary to=assistant<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant"
        "<|channel|>final<|message|>" + HELLO, "auto", [], THINKING, HELLO, []),
    "stray commentary before final": (
        "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>commentary to=assistant"
        "<|channel|>final<|message|>" + HELLO, "auto", [], THINKING, HELLO, []),
}


def _tools(tools: list[dict]) -> ToolConfig | None:
    return ToolConfig(tuple(tools), "auto", format=HARMONY) if tools else None


def _calls(calls: list[dict]) -> list[tuple[str, dict]]:
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def _streamed(parser, pieces: list[str]) -> tuple[str, str, list[dict]]:
    reasoning, content, calls = "", "", []
    for i, piece in enumerate(pieces):
        r, c, k = parser.feed(piece, final=i == len(pieces) - 1)
        reasoning, content, calls = reasoning + r, content + c, calls + k
    return reasoning, content, calls


def _token_pieces(text: str) -> list[str]:
    """The pieces a token stream gives: each special marker whole, the text between in 3-char bits."""
    out, i = [], 0
    while i < len(text):
        j = text.find("<|", i)
        if j == i:
            k = text.index("|>", i) + 2
            out.append(text[i:k])
            i = k
        else:
            end = len(text) if j < 0 else j
            out += [text[p:min(p + 3, end)] for p in range(i, end, 3)]
            i = end
    return out + [""]


@pytest.mark.parametrize("name", CASES)
def test_llama_cpp_gpt_oss_cases(name):
    output, fmt, tools, reasoning, content, calls = CASES[name]
    mode = ReasoningMode(fmt, harmony="")
    got = answer_parser(mode, _tools(tools), stream=False).parse(output)
    assert got[:2] == (reasoning, content) and _calls(got[2]) == calls
    for pieces in ([*output, ""], _token_pieces(output)):
        parser = answer_parser(mode, _tools(tools), stream=True)
        r, c, k = _streamed(parser, pieces)
        assert (r, c, _calls(k)) == (reasoning, content, calls), pieces
        assert _calls(parser.tool_calls) == calls


def test_partial_analysis_streams_its_reasoning():
    """llama.cpp's partial case: `<|channel|>analysis<|message|>I'm\\nthinking`, not yet ended."""
    parser = HarmonyParser()
    assert parser.feed("<|channel|>analysis<|message|>I'm\nthink") == ("I'm\nthink", "", [])
    assert parser.feed("ing<|en") == ("ing", "", [])   # a tail that may become <|end|> is held
    assert parser.feed("d|><|start|>assistant<|channel|>final<|message|>Hi", final=True) == ("", "Hi", [])


def test_continued_messages_answer_only_the_generated_text():
    """llama.cpp's two continuation cases: the prompt ends inside the final message, or inside
    the analysis one; what follows is read in that message."""
    prompt = ("<|start|>user<|message|>Hey there!<|end|><|start|>assistant<|channel|>analysis<|message|>I'm thinking"
              "<|end|><|start|>assistant<|channel|>final<|message|>Hello, ")
    parser = HarmonyParser(prefix=answer_prefix(prompt))
    assert parser.parse(HELLO.removeprefix("Hello, ")) == ("", "world!\nWhat's up?", [])
    parser = HarmonyParser(prefix=answer_prefix("<|start|>user<|message|>Hey<|end|><|start|>assistant"
                                                "<|channel|>analysis<|message|>I'm"))
    assert parser.parse(" thinking<|end|><|start|>assistant<|channel|>final<|message|>" + HELLO) == \
        (" thinking", HELLO, [])
    assert answer_prefix("<|start|>user<|message|>Hi<|end|><|start|>assistant") == ""
    assert answer_prefix("<|start|>assistant<|channel|>final<|message|>A<|end|><|start|>user<|message|>B<|end|>") == ""


def test_output_that_is_no_harmony_is_given_back_as_content():
    """Where llama.cpp's parse fails (and its server answers an error), nothing is dropped here."""
    assert HarmonyParser().parse("Just text, no header.") == ("", "Just text, no header.", [])
    bad = "<|channel|>commentary to=functions.special_function<|message|>{not json"
    assert HarmonyParser(tools=_tools([SPECIAL])).parse(bad) == ("", "{not json", [])
    assert HarmonyParser().parse("<|channel|>analysis<|message|>  \n<|end|><|start|>assistant<|channel|>final"
                                 "<|message|>ok") == ("", "ok", [])   # whitespace-only reasoning is dropped


def test_only_offered_functions_are_calls_and_one_without_parallel_calls():
    two = ("<|channel|>commentary to=functions.special_function<|message|>{\"arg1\": 1}<|call|>"
           "<|start|>assistant<|channel|>commentary to=functions.special_function<|message|>{\"arg1\": 2}")
    assert _calls(HarmonyParser(tools=_tools([SPECIAL])).parse(two)[2]) == [CALL]
    parallel = ToolConfig((SPECIAL,), "auto", parallel=True, format=HARMONY)
    assert _calls(HarmonyParser(tools=parallel).parse(two)[2]) == [CALL, ("special_function", {"arg1": 2})]
    assert HarmonyParser(tools=_tools([EDIT])).parse(two) == ("", "", [])   # not offered: unsolicited, dropped
    none = ToolConfig((SPECIAL,), "none", format=HARMONY)
    assert HarmonyParser(tools=none).parse(two) == ("", "", [])


def test_gpt_oss_templates_choose_harmony():
    source = "{{- '<|start|>assistant<|channel|>final<|message|>' }} {% if tools %}{% endif %}"
    assert template_is_harmony(source) and choose_format(source) == HARMONY
    assert choose_format("{% if tools %}{% endif %}") == HERMES and not template_is_harmony("{{ messages }}")
    hermes = ToolConfig((SPECIAL,), "auto", format=HERMES)   # --tool-call-format hermes on a gpt-oss template
    parser = answer_parser(ReasoningMode("auto", harmony=""), hermes, stream=False)
    out = parser.parse('<|channel|>final<|message|><tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}'
                       '\n</tool_call>')
    assert out[:2] == ("", "") and _calls(out[2]) == [CALL]


TEMPLATES = json.loads((Path(__file__).parent / "fixtures" / "harmony_templates.json").read_text())
GPT_OSS = TEMPLATES["cases"][0]
DATE = re.compile(r"Current date: \d{4}-\d{2}-\d{2}")


@pytest.mark.parametrize("i", range(len(GPT_OSS["conversations"])))
def test_gpt_oss_template_renders_as_llama_server(i):
    """llama.cpp's openai-gpt-oss-120b.jinja in our sandbox: tools, reasoning_effort, developer
    and system messages, a call with its reasoning_content and result, as llama-server's
    /apply-template (tests/fixtures/harmony_templates.json; playground/make_harmony_fixture.py)."""
    conv = GPT_OSS["conversations"][i]
    template = ChatTemplate(GPT_OSS["source"], TEMPLATES["bos_token"], TEMPLATES["eos_token"], TEMPLATES["add_bos"])
    config = parse_tools(Fields({"tools": conv.get("tools", [])}), GPT_OSS["source"])
    assert config.format == HARMONY
    got = render_with_tools(template, conv["messages"], config, variables=conv.get("chat_template_kwargs"))
    assert DATE.sub("DATE", got) == DATE.sub("DATE", conv["prompt"])
    assert ("Reasoning: " + conv.get("chat_template_kwargs", {}).get("reasoning_effort", "medium")) in got


def test_a_gpt_oss_chat_request_answers_in_harmony():
    """The chat request path: a gpt-oss template makes the answer harmony, read after its
    generation prompt, and a call in the answer a tool call."""
    template = ChatTemplate(GPT_OSS["source"], TEMPLATES["bos_token"], TEMPLATES["eos_token"], TEMPLATES["add_bos"])
    body = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [SPECIAL]}
    f = Fields(body)
    tools = parse_tools(f, template.source)
    text, mode = render_chat_request(f, template, tools, ChatDefaults())
    assert text.endswith("<|start|>assistant") and mode.harmony == "" and mode.format == "auto"
    out = ("<|channel|>analysis<|message|>Need the tool.<|end|><|start|>assistant<|channel|>commentary "
           "to=functions.special_function <|constrain|>json<|message|>{\"arg1\": 7}")
    reasoning, content, calls = answer_parser(mode, tools, stream=False).parse(out)
    assert (reasoning, content, _calls(calls)) == ("Need the tool.", "", [("special_function", {"arg1": 7})])


def test_a_forced_call_grammar_admits_exactly_harmony_calls_to_the_allowed_functions(tokenizer):
    """tool_choice required / named: the output is one harmony call whose arguments match the
    function's schema (tools/grammar.py), and it parses back into that call."""
    from slotserver.engine.grammar import Grammars
    from slotserver.server.tools.grammar import forced_call_grammar

    grammars = Grammars(tokenizer)
    config = ToolConfig((SPECIAL, EDIT), "required", format=HARMONY)
    grammar = forced_call_grammar(config)
    grammars.check(grammar)
    good = '<|channel|>commentary to=functions.special_function <|constrain|>json<|message|>{"arg1": 3}'
    for text, ok in ((good, True), (good.replace('{"arg1": 3}', '{"arg1": "x"}'), False),
                     (good.replace("special_function", "other"), False)):
        m = grammars.matcher(grammar)
        accepted = m.consume_tokens(tokenizer.encode(text, add_special=False, parse_special=False))
        assert (accepted and m.is_accepting()) == ok, text
    assert _calls(HarmonyParser(tools=config).parse(good)[2]) == [("special_function", {"arg1": 3})]
    named = forced_call_grammar(ToolConfig((SPECIAL, EDIT), "named", "edit", format=HARMONY))
    assert "functions.edit" in named and "special_function" not in named


def test_the_chat_formatters_answer_harmony_whole_and_streamed():
    """What a client sees: OpenAI's message and stream deltas, Anthropic's blocks, for a gpt-oss
    answer that thinks, says a preamble and calls a tool."""
    from slotserver.engine.request import FinalEvent, Request
    from slotserver.server.formats.anthropic import AnthropicFormatter
    from slotserver.server.formats.openai import OpenAIFormatter
    from slotserver.server.generation import Outcome
    from slotserver.server.openai_params import OpenAIJob
    from slotserver.server.params import CompletionJob

    tools = ToolConfig((SPECIAL,), "auto", format=HARMONY)
    mode = ReasoningMode("auto", harmony="")
    text = ("<|channel|>analysis<|message|>Need arg1.<|end|><|start|>assistant<|channel|>commentary<|message|>"
            "Calling.<|end|><|start|>assistant<|channel|>commentary to=functions.special_function <|constrain|>json"
            "<|message|>{\"arg1\": 1}")
    final = FinalEvent("eos", "", False, 0, 5, 0, 9, 1.0, 1.0, 0)
    job = CompletionJob(Request((1, 2)))
    body = OpenAIFormatter(job, "m", None, True, tools, mode).full(Outcome(text=text, final=final))
    message, choice = body["choices"][0]["message"], body["choices"][0]
    got = (message["reasoning_content"], message["content"], choice["finish_reason"])
    assert got == ("Need arg1.", "Calling.", "tool_calls")
    assert _calls(message["tool_calls"]) == [CALL]
    fmt = OpenAIFormatter(job, "m", None, True, tools, mode)
    chunks = [c for p in _token_pieces(text) for c in fmt.stream_pieces(p, [])] + fmt.stream_pieces("", [], final=True)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Need arg1."
    assert "".join(d.get("content") or "" for d in deltas) == "Calling."
    heads = [t for d in deltas for t in d.get("tool_calls", []) if "id" in t]
    assert [(h["index"], h["function"]["name"]) for h in heads] == [(0, "special_function")]
    assert fmt.last_chunk(final)["choices"][0]["finish_reason"] == "tool_calls"
    anthropic = AnthropicFormatter(OpenAIJob([job], "m", [""], tools, mode)).full(Outcome(text=text, final=final))
    assert [b["type"] for b in anthropic["content"]] == ["thinking", "text", "tool_use"]
    assert anthropic["content"][2]["input"] == {"arg1": 1} and anthropic["stop_reason"] == "tool_use"


def test_the_reasoning_budget_counts_harmonys_analysis_message(tokenizer):
    """reasoning_budget_tokens on a gpt-oss template: the block is the analysis message (llama.cpp's
    thinking tags for GPT-OSS), over the request's tags; a prompt that continues an analysis
    message leaves it open."""
    from slotserver.server.config import GenerationDefaults
    from slotserver.server.harmony import BUDGET_TAGS
    from slotserver.server.openai_params import parse_chat

    template = ChatTemplate(GPT_OSS["source"], TEMPLATES["bos_token"], TEMPLATES["eos_token"], TEMPLATES["add_bos"])
    body = {"messages": [{"role": "user", "content": "Hi"}], "reasoning_budget_tokens": 5,
            "reasoning_budget_start_tag": "<think>", "reasoning_budget_end_tags": ["</think>"]}
    spec = parse_chat(body, tokenizer, template, GenerationDefaults(), "m").jobs[0].request.reasoning_budget
    ids = lambda text: tuple(tokenizer.encode(text, add_special=False, parse_special=True))   # noqa: E731
    assert spec.budget == 5 and spec.start == (ids(BUDGET_TAGS[0]),) and spec.end == (ids("<|end|>"),)
    assert not spec.opened
    assert in_analysis("<|channel|>analysis<|message|>I'm") and not in_analysis("<|channel|>final<|message|>Hi")
    assert not in_analysis("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>final<|message|>")


# ---------------------------------------------------------------------------------------------
# through HTTP: the tiny model's answer forced by a grammar, the template gpt-oss's

CITY = {"type": "function", "function": {"name": "get_weather", "parameters": {   # a closed object: a short call
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Lima"]}}, "required": ["city"],
    "additionalProperties": False}}}
HARMONY_ANSWER = ("<|channel|>analysis<|message|>The user asks for a capital.<|end|><|start|>assistant"
                  "<|channel|>final<|message|>Paris.")


@pytest.fixture(scope="module")
def gpt_oss_client(tmp_path_factory):
    from starlette.testclient import TestClient
    from tiny_engine import running_tiny_engine

    from slotserver.server import ServerConfig, ServerState, create_app

    with running_tiny_engine(tmp_path_factory.mktemp("tiny"), 1, 1024, ctx_len=1024) as (bundle, engine):
        state = ServerState(ServerConfig(model_path=str(bundle.config.model_path)))
        state.set_loaded(bundle, engine, ChatTemplate(GPT_OSS["source"]))
        with TestClient(create_app(state)) as client:
            yield client


def _post(client, **body) -> dict:
    body = {"messages": [{"role": "user", "content": "Capital of France?"}], "temperature": 0, "max_tokens": 200,
            **body}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json() if not body.get("stream") else r.text


def test_http_gpt_oss_answers_split_reasoning_and_content(gpt_oss_client):
    from test_server_api import sse_events

    grammar = "root ::= " + json.dumps(HARMONY_ANSWER)
    message = _post(gpt_oss_client, grammar=grammar)["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("The user asks for a capital.", "Paris.")
    events = [json.loads(e) for e in sse_events(_post(gpt_oss_client, grammar=grammar, stream=True))[:-1]]
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "The user asks for a capital."
    assert "".join(d.get("content") or "" for d in deltas) == "Paris."


def test_http_gpt_oss_required_tool_call_comes_back_as_a_call(gpt_oss_client):
    """tool_choice required: the harmony grammar forces a call the parser returns as tool_calls."""
    body = _post(gpt_oss_client, tools=[CITY], tool_choice="required", seed=3)
    choice = body["choices"][0]
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"])["city"] in ("Paris", "Lima")
    assert choice["finish_reason"] == "tool_calls" and not choice["message"]["content"]


def test_a_string_plus_null_or_undefined_renders_as_in_llama_cpps_runtime():
    """llama.cpp's Jinja runtime concatenates a string with null or undefined as with ""
    (gpt-oss's `"// " + tool.description`); any other operation on them still fails."""
    from slotserver.errors import ChatTemplateError

    source = "{{ '[' + messages[0].missing + ']' }}{{ nothing + '!' }}{{ '<' + gone }}{{ 1 + 2 }}"
    assert ChatTemplate(source).render([{"role": "user", "content": "x"}], variables={"gone": None}) == "[]!<3"
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ missing + 1 }}").render([{"role": "user", "content": "x"}])
