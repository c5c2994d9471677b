"""Reasoning models and chat template variables: the `<think>` split (reasoning.py) as a unit and
through HTTP, `reasoning_format`, forced-open thinking, `chat_template_kwargs` (request and
`--chat-template-kwargs`), the thinking switches, and the 400s for llama-server fields we do not
implement (unsupported.py). The reasoning budget: test_reasoning_budget.py.

Through HTTP the tiny random model's answer is forced with a GBNF grammar (one string), so the
text to split is known; the template is ours (`--chat-template`), so the prompt is too.
"""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient
from test_server_api import assert_error, sse_events
from tiny_engine import running_tiny_engine

from slotserver.cli.main import build_parser
from slotserver.engine.request import FinalEvent, Request
from slotserver.model.config import ConfigError
from slotserver.model.text.chat_template import CHATML_TEMPLATE, ChatTemplate
from slotserver.server import ServerConfig, ServerState, create_app
from slotserver.server.chat_options import ChatDefaults, chat_defaults_from_flags
from slotserver.server.config import GenerationDefaults
from slotserver.server.openai_params import parse_chat
from slotserver.server.fields import Fields
from slotserver.server.formats.openai import OpenAIFormatter
from slotserver.server.generation import Outcome
from slotserver.server.params import CompletionJob
from slotserver.server.reasoning import CONTENT, START, THINK, ReasoningMode, ReasoningSplitter, answer_start
from slotserver.server.tools.request import parse_tools

# ---------------------------------------------------------------------------------------------
# the splitter on its own

WHOLE = [  # (text, start, (reasoning, content)) with llama.cpp's rules
    ("<think>\nLet me see.\n</think>\n\nParis.", START, ("Let me see.", "Paris.")),
    ("  <think>a</think>b", START, ("a", "b")),
    ("Paris. <think>no</think>", START, ("", "Paris. <think>no</think>")),
    ("<think>still thinking", START, ("still thinking", "")),
    ("<think></think>Hi", START, ("", "Hi")),
    ("<thi", START, ("", "<thi")),
    ("  ", START, ("", "  ")),
    ("step 1</think>\n42", THINK, ("step 1", "42")),
    ("<think>x</think>y", THINK, ("<think>x", "y")),
    ("more</think>y", CONTENT, ("", "more</think>y")),
]


@pytest.mark.parametrize("text,start,expected", WHOLE)
def test_whole_answers_split_as_llama_cpp_does(text, start, expected):
    assert ReasoningSplitter(start=start).parse(text) == expected
    assert ReasoningSplitter(extract=False, start=start).parse(text) == ("", text)


def test_legacy_inline_keeps_the_block_in_content_with_its_tags():
    assert ReasoningSplitter(inline=True).parse("<think> a b \n</think>\n c") == ("", "<think>a b</think>c")
    assert ReasoningSplitter(inline=True).parse("<think>unfinished") == ("", "<think>unfinished</think>")
    assert ReasoningSplitter(inline=True).parse("<think> </think>x") == ("", "x")   # empty: no tags


PIECES = st.lists(st.sampled_from(["<think>", "</think>", "<", "</", "<th", "ink>", "think", "/", ">", " ", "\n",
                                   "a", "b c", "<tool_call>", "\t"]), max_size=14)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(pieces=PIECES, cuts=st.lists(st.integers(0, 200), max_size=8), start=st.sampled_from([START, THINK, CONTENT]),
       inline=st.booleans())
def test_any_split_of_a_text_gives_what_the_whole_text_gives(pieces, cuts, start, inline):
    text = "".join(pieces)
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    splitter, reasoning, content = ReasoningSplitter(start=start, inline=inline), [], []
    for a, b in itertools.pairwise(bounds):
        r, c = splitter.feed(text[a:b])
        reasoning.append(r)
        content.append(c)
    r, c = splitter.feed("", final=True)
    whole = ReasoningSplitter(start=start, inline=inline).parse(text)
    assert ("".join(reasoning) + r, "".join(content) + c) == whole


def test_a_partial_tag_is_held_back_until_decided():
    s = ReasoningSplitter()
    assert s.feed("<thi") == ("", "")
    assert s.feed("nk>Hmm, ") == ("Hmm,", "")           # trailing space held: it may end the reasoning
    assert s.feed("ok</thi") == (" ok", "")
    assert s.feed("nk>\n") == ("", "")
    assert s.feed("Yes") == ("", "Yes")
    s = ReasoningSplitter()
    assert s.feed("<b") == ("", "<b")                    # cannot become <think>: content at once


def test_answer_start_follows_the_prompt_or_the_continued_message():
    assert answer_start("<|im_start|>assistant\n<think>\n") == THINK
    assert answer_start("<|im_start|>assistant\n<think>\n\n</think>\n\n") == START
    assert answer_start("<|im_start|>assistant\n") == START
    assert answer_start("...", continued="<think>so far") == THINK
    assert answer_start("...", continued="<think>a</think>The answer") == CONTENT
    assert answer_start("...", continued="") == START


# ---------------------------------------------------------------------------------------------
# the OpenAI formatter: reasoning first, tool calls from what remains

def _final(n: int = 3) -> FinalEvent:
    return FinalEvent("eos", "", False, 0, 5, 0, n, 1.0, 1.0, 0)


def test_tool_calls_are_parsed_from_the_content_after_the_reasoning():
    tools = parse_tools(Fields({"tools": [{"type": "function", "function": {"name": "f"}}]}))
    job = CompletionJob(Request((1, 2)))
    call = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    text = f"<think>maybe {call}</think>\n{call}"
    fmt = OpenAIFormatter(job, "m", None, True, tools, ReasoningMode("deepseek"))
    message = fmt.full(Outcome(text=text, final=_final()))["choices"][0]["message"]
    assert message["reasoning_content"] == f"maybe {call}"
    assert len(message["tool_calls"]) == 1 and message["content"] is None
    fmt = OpenAIFormatter(job, "m", None, True, tools, ReasoningMode("deepseek"))
    chunks = [c for i in range(0, len(text), 5) for c in fmt.stream_pieces(text[i:i + 5], [])]
    chunks += fmt.stream_pieces("", [], final=True)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == f"maybe {call}"
    assert sum(1 for d in deltas for t in d.get("tool_calls", []) if "id" in t) == 1


# ---------------------------------------------------------------------------------------------
# through HTTP

THINKING = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n"
            "{% if enable_thinking %}<think>\n{% else %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
ASK = [{"role": "user", "content": "Capital of France?"}]


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    """(bundle, engine) on the tiny model with room for forced answers (its vocabulary is mostly
    bytes, so an answer costs about a token per character)."""
    with running_tiny_engine(tmp_path_factory.mktemp("tiny"), 2, 512) as running:
        yield running


def serve(tiny_engine, template: str = CHATML_TEMPLATE, **chat_flags) -> TestClient:
    bundle, engine = tiny_engine
    config = ServerConfig(model_path=str(bundle.config.model_path), chat=chat_defaults_from_flags(**chat_flags))
    state = ServerState(config)
    state.set_loaded(bundle, engine, ChatTemplate(template))
    return TestClient(create_app(state))


def forced(text: str) -> str:
    return "root ::= " + json.dumps(text)


def chat(client, answer: str, **extra) -> dict:
    body = {"messages": ASK, "grammar": forced(answer), "temperature": 0, "max_tokens": 150, **extra}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def streamed(client, answer: str, **extra) -> tuple[str, str, list[dict]]:
    body = {"messages": ASK, "grammar": forced(answer), "temperature": 0, "max_tokens": 150, "stream": True, **extra}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    deltas = [json.loads(e)["choices"][0]["delta"] for e in events[:-1] if json.loads(e)["choices"]]
    return ("".join(d.get("reasoning_content") or "" for d in deltas),
            "".join(d.get("content") or "" for d in deltas), deltas)


@pytest.fixture(scope="module")
def client(tiny_engine):
    with serve(tiny_engine) as c:
        yield c


ANSWER = "<think>\nThe user asks for a capital.\n</think>\n\nParis."


def test_chat_answer_carries_reasoning_content_and_clean_content(client):
    message = chat(client, ANSWER)["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Paris.", "reasoning_content": "The user asks for a capital."}
    message = chat(client, "Paris.")["choices"][0]["message"]
    assert "reasoning_content" not in message and message["content"] == "Paris."   # only when non-empty


def test_stream_sends_reasoning_deltas_then_content_deltas_adding_up_to_the_whole(client):
    reasoning, content, deltas = streamed(client, ANSWER)
    assert (reasoning, content) == ("The user asks for a capital.", "Paris.")
    kinds = [k for d in deltas for k in ("reasoning_content", "content") if d.get(k)]
    assert kinds == sorted(kinds, key=lambda k: k == "content")   # all reasoning before any content
    assert not any(d.get(k) and ("<" in d[k] or ">" in d[k]) for d in deltas for k in ("reasoning_content", "content"))


def test_reasoning_format_none_and_deepseek_legacy(client):
    assert chat(client, ANSWER, reasoning_format="none")["choices"][0]["message"] == {
        "role": "assistant", "content": ANSWER}
    assert streamed(client, ANSWER, reasoning_format="none")[:2] == ("", ANSWER)
    legacy = chat(client, ANSWER, reasoning_format="deepseek-legacy")["choices"][0]["message"]
    assert (legacy["reasoning_content"], legacy["content"]) == ("The user asks for a capital.", "Paris.")
    assert streamed(client, ANSWER, reasoning_format="deepseek-legacy")[:2] == (
        "", "<think>The user asks for a capital.</think>Paris.")
    assert_error(client.post("/v1/chat/completions", json={"messages": ASK, "reasoning_format": "r1"}), 400)


def test_server_reasoning_format_flag_is_the_default(tiny_engine):
    with serve(tiny_engine, reasoning_format="none") as c:
        assert chat(c, ANSWER)["choices"][0]["message"]["content"] == ANSWER
        assert chat(c, ANSWER, reasoning_format="auto")["choices"][0]["message"]["content"] == "Paris."


def test_a_template_that_opens_think_makes_the_answer_start_inside_it(tiny_engine):
    with serve(tiny_engine, THINKING) as c:
        prompt = c.post("/apply-template", json={"messages": ASK}).json()["prompt"]
        assert prompt.endswith("assistant\n<think>\n")
        answer = "It is Paris.\n</think>\n\nParis."
        message = chat(c, answer)["choices"][0]["message"]
        assert (message["reasoning_content"], message["content"]) == ("It is Paris.", "Paris.")
        assert streamed(c, answer)[:2] == ("It is Paris.", "Paris.")
        # thinking off: the template closes the block itself, the answer is plain content
        off = {"chat_template_kwargs": {"enable_thinking": False}}
        assert c.post("/apply-template", json={"messages": ASK, **off}).json()["prompt"].endswith("</think>\n\n")
        assert chat(c, "Paris.", **off)["choices"][0]["message"] == {"role": "assistant", "content": "Paris."}


@pytest.mark.parametrize("switch", [{"chat_template_kwargs": {"enable_thinking": False}},
                                    {"reasoning_effort": "none"}])
def test_every_thinking_switch_reaches_the_template(tiny_engine, switch):
    with serve(tiny_engine, THINKING) as c:
        prompt = c.post("/apply-template", json={"messages": ASK, **switch}).json()["prompt"]
        assert prompt.endswith("<think>\n\n</think>\n\n")
        # a budget of 0 leaves the template alone: the sampler forces </think> (test_reasoning_budget.py)
        budget = c.post("/apply-template", json={"messages": ASK, "reasoning_budget_tokens": 0}).json()["prompt"]
        assert budget.endswith("assistant\n<think>\n")
    for flags in ({"reasoning": "off"}, {"kwargs_json": '{"enable_thinking": false}'}):
        with serve(tiny_engine, THINKING, **flags) as c:
            prompt = c.post("/apply-template", json={"messages": ASK}).json()["prompt"]
            assert prompt.endswith("<think>\n\n</think>\n\n")
            on = {"chat_template_kwargs": {"enable_thinking": True}}   # the request's kwargs win
            assert c.post("/apply-template", json={"messages": ASK, **on}).json()["prompt"].endswith("<think>\n")


KWARGS = "[{{ greeting }}|{{ level }}|{{ reasoning_effort }}|{{ opts.deep }}]{% for m in messages %}{{ m.content }}{% endfor %}"


def test_chat_template_kwargs_reach_the_template_over_the_server_defaults(tiny_engine):
    flags = {"kwargs_json": '{"greeting": "hello", "level": 1, "opts": {"deep": "d"}}'}
    with serve(tiny_engine, KWARGS, **flags) as c:
        def prompt(**extra) -> str:
            r = c.post("/apply-template", json={"messages": ASK, **extra})
            assert r.status_code == 200, r.text
            return r.json()["prompt"]

        assert prompt() == "[hello|1||d]Capital of France?"
        assert prompt(chat_template_kwargs={"level": [1, 2]}) == "[hello|[1, 2]||d]Capital of France?"
        assert prompt(reasoning_effort="high") == "[hello|1|high|d]Capital of France?"
        # the chat route renders the same prompt (the tiny model's /slots debug is off; check via usage)
        r = chat(c, "ok", chat_template_kwargs={"greeting": "x" * 40})
        assert r["usage"]["prompt_tokens"] > chat(c, "ok")["usage"]["prompt_tokens"]


def test_reasoning_effort_flag_is_the_templates_default_until_a_request_sets_its_own(tiny_engine):
    with serve(tiny_engine, KWARGS, effort="low") as c:   # llama-server's --reasoning-effort low
        def prompt(**extra) -> str:
            return c.post("/apply-template", json={"messages": ASK, **extra}).json()["prompt"]

        assert prompt() == "[||low|]Capital of France?"
        assert prompt(reasoning_effort="high") == "[||high|]Capital of France?"
        assert prompt(chat_template_kwargs={"reasoning_effort": "max"}) == "[||max|]Capital of France?"


@pytest.mark.parametrize("kwargs,named", [
    ("yes", "chat_template_kwargs"), ([1], "chat_template_kwargs"),
    ({"enable_thinking": "false"}, "enable_thinking"), ({"messages": []}, "messages"),
])
def test_bad_chat_template_kwargs_are_400_naming_the_field(client, kwargs, named):
    for path in ("/v1/chat/completions", "/apply-template"):
        err = assert_error(client.post(path, json={"messages": ASK, "chat_template_kwargs": kwargs}), 400)
        assert named in err["message"]


def test_server_flags_parse_and_bad_values_fail_at_startup():
    args = build_parser().parse_args(["serve", "--reasoning-format", "deepseek", "--chat-template-kwargs",
                                      '{"a": 1}', "-rea", "off"])
    d = chat_defaults_from_flags(args.reasoning_format, args.chat_template_kwargs, args.reasoning)
    assert d.reasoning_format == "deepseek" and d.template_kwargs == {"a": 1, "enable_thinking": False,
                                                                      "preserve_reasoning": True}
    assert build_parser().parse_args(["serve"]).reasoning_format == "auto"   # llama-server's default
    for bad, flag in [({"reasoning_format": "r1"}, "--reasoning-format"), ({"kwargs_json": "{"}, "--chat-template-kwargs"),
                      ({"kwargs_json": "[1]"}, "--chat-template-kwargs"),
                      ({"reasoning": "maybe"}, "--reasoning"),
                      ({"kwargs_json": '{"enable_thinking": "no"}'}, "--chat-template-kwargs")]:
        with pytest.raises(ConfigError, match=flag):
            chat_defaults_from_flags(**bad)


PRESERVE = ("[{{ preserve_reasoning }}|{{ preserve_thinking }}|{{ clear_thinking }}|{{ drop_thinking }}|"
            "{{ reasoning_strength }}]{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}")


def test_preserved_reasoning_reaches_the_template_as_llama_server_passes_it(tiny_engine):
    """On by default, its opposite variables set to match; --no-reasoning-preserve and a request's
    chat_template_kwargs turn it off; a template variable the request gives itself wins."""
    def prompt(c, **extra) -> str:
        return c.post("/apply-template", json={"messages": ASK, **extra}).json()["prompt"]

    with serve(tiny_engine, PRESERVE) as c:
        assert prompt(c) == "[True|True|False|False|]user:Capital of France?;"
        off = {"chat_template_kwargs": {"preserve_reasoning": False}}
        assert prompt(c, **off) == "[False|False|True|True|]user:Capital of France?;"
        assert prompt(c, chat_template_kwargs={"clear_thinking": True}) == "[True|True|True|False|]user:Capital of France?;"
        assert prompt(c, reasoning_effort="high").endswith("|high]user:Capital of France?;")
    with serve(tiny_engine, PRESERVE, preserve=False) as c:
        assert prompt(c) == "[False|False|True|True|]user:Capital of France?;"


def test_prefill_assistant_off_makes_a_final_assistant_message_whole(tiny_engine):
    messages = ASK + [{"role": "assistant", "content": "Par"}]
    with serve(tiny_engine) as c:
        assert c.post("/apply-template", json={"messages": messages}).json()["prompt"].endswith("assistant\nPar")
    with serve(tiny_engine, prefill_assistant=False) as c:
        prompt = c.post("/apply-template", json={"messages": messages}).json()["prompt"]
        assert prompt.endswith("assistant\nPar<|im_end|>\n<|im_start|>assistant\n")


def test_skip_chat_parsing_leaves_reasoning_and_tool_calls_in_the_content(tiny_engine):
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    with serve(tiny_engine, pure_content=True) as c:
        assert chat(c, ANSWER)["choices"][0]["message"] == {"role": "assistant", "content": ANSWER}
        assert chat(c, ANSWER, reasoning_format="deepseek")["choices"][0]["message"]["content"] == ANSWER
    # tool calls: neither parsed out of the answer nor forced by a grammar (llama.cpp's pure content parser)
    bundle, _ = tiny_engine
    body = {"messages": ASK, "tools": [tool], "tool_choice": "required"}
    plain, pure = (parse_chat(body, bundle.tokenizer, ChatTemplate(CHATML_TEMPLATE), GenerationDefaults(), "m",
                              chat=ChatDefaults(pure_content=flag)) for flag in (False, True))
    assert plain.tools is not None and plain.job.request.grammar is not None
    assert pure.tools is None and pure.job.request.grammar is None
    args = build_parser().parse_args(["serve", "--skip-chat-parsing", "--no-prefill-assistant", "--no-reasoning-preserve"])
    assert (args.skip_chat_parsing, args.prefill_assistant, args.reasoning_preserve) == (True, False, False)


# ---------------------------------------------------------------------------------------------
# llama-server fields we do not implement: 400 naming them; their defaults pass

REFUSED = [("verbose", True), ("backend_sampling", True), ("grammar_lazy", True), ("reasoning_control", True),
           ("grammar_triggers", ["<x>"]), ("preserved_tokens", ["<x>"]),
           ("chat_parser", "x"), ("generation_prompt", "x"), ("chat_format", 3)]
DEFAULTS = {"n_indent": 0, "t_max_predict_ms": -1, "n_cache_reuse": 0, "sse_ping_interval": -1, "verbose": False,
            "backend_sampling": False, "grammar_lazy": False, "reasoning_control": False, "lora": [],
            "grammar_triggers": [], "preserved_tokens": [], "chat_format": 0, "n_discard": 8,
            "reasoning_budget_tokens": -1, "response_fields": ["content"], "reasoning_format": "deepseek"}
ROUTES = [("/completion", {"prompt": "hi"}), ("/v1/completions", {"prompt": "hi"}), ("/v1/chat/completions", {"messages": ASK})]


@pytest.mark.parametrize("path,base", ROUTES)
@pytest.mark.parametrize("name,value", REFUSED)
def test_unimplemented_fields_are_refused_naming_them(client, path, base, name, value):
    err = assert_error(client.post(path, json={**base, "max_tokens": 1, name: value}), 400)
    assert f"'{name}'" in err["message"]


@pytest.mark.parametrize("path,base", ROUTES)
def test_their_default_values_are_accepted(client, path, base):
    r = client.post(path, json={**base, "max_tokens": 1, **DEFAULTS})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("body,name", [
    ({"echo": True}, "echo"), ({"parse_tool_calls": True}, "parse_tool_calls"),
    ({"reasoning_format": "x"}, "reasoning_format")])
def test_chat_only_fields_are_refused_on_completion(client, body, name):
    err = assert_error(client.post("/completion", json={"prompt": "hi", "n_predict": 1, **body}), 400)
    assert f"'{name}'" in err["message"]


def test_response_fields_and_completion_aliases(client):
    body = {"prompt": "hi", "temperature": 0, "max_completion_tokens": 2, "logprobs": 2}
    full = client.post("/completion", json=body).json()
    assert full["tokens_predicted"] == 2 and len(full["completion_probabilities"]) == 2
    picked = client.post("/completion", json={**body, "response_fields": [
        "content", "generation_settings/n_predict", "nope", "timings/nope"]}).json()
    assert picked == {"content": full["content"], "generation_settings/n_predict": 2}
    events = sse_events(client.post("/completion", json={**body, "stream": True,
                                                         "response_fields": ["stop_type"]}).text)
    assert json.loads(events[-1]) == {"stop_type": "limit"}
    assert_error(client.post("/completion", json={**body, "response_fields": "content"}), 400)


CALL_IN_THOUGHT = "Let me look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(cuts=st.lists(st.integers(0, len(CALL_IN_THOUGHT)), max_size=8))
def test_a_tool_call_opened_inside_the_thought_ends_it_and_starts_the_content(cuts):
    """Qwen3.5's prompt leaves <think> open; a call made without closing the thought is still a call
    (llama.cpp's qwen3-coder parser ends the reasoning at `<tool_call>`, kept in the content), and
    any chunking of the stream gives the whole answer's split."""
    from slotserver.server.reasoning import THINK, ReasoningSplitter
    whole = ReasoningSplitter(start=THINK, ends=("<tool_call>",)).parse(CALL_IN_THOUGHT)
    assert whole == ("Let me look.", CALL_IN_THOUGHT[len("Let me look.\n"):])
    splitter, bounds = ReasoningSplitter(start=THINK, ends=("<tool_call>",)), sorted({0, len(CALL_IN_THOUGHT), *cuts})
    parts = [splitter.feed(CALL_IN_THOUGHT[a:b]) for a, b in itertools.pairwise(bounds)] + [splitter.feed("", final=True)]
    assert ("".join(p[0] for p in parts), "".join(p[1] for p in parts)) == whole


def test_the_qwen3_coder_format_ends_a_thought_at_its_call_and_others_do_not(tiny_engine):
    from pathlib import Path
    source = next(c["source"] for c in json.loads((Path(__file__).parent / "fixtures" / "tool_templates_xml.json")
                                                 .read_text())["cases"] if c["name"] == "qwen3.5")
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    bundle, _ = tiny_engine

    def ends(template: str, **body) -> tuple[str, ...]:
        job = parse_chat({"messages": ASK, "tools": [tool], **body}, bundle.tokenizer, ChatTemplate(template),
                         GenerationDefaults(), "m")
        return job.reasoning.ends
    assert ends(source) == ("<tool_call>",)
    assert ends(source, tool_choice="none") == () and ends(CHATML_TEMPLATE) == ()
