"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) end to end through HTTP, with
the official `anthropic` SDK and raw SSE; and the stream formatter on its own.

The server runs the default model (SmolLM2) with an API key, so every SDK call also checks that
`x-api-key` (how the SDK sends its key) is accepted. Answers are greedy (temperature 0), and a tool
call is forced with tool_choice, so what the model says is known. A second server state on the
same engine has a thinking template (its generation prompt opens `<think>`), for thinking blocks.
"""

from __future__ import annotations

import json

import pytest
from smollm_server import smollm_client
from starlette.testclient import TestClient

from slotserver.engine.request import FinalEvent, Request
from slotserver.model.text.chat_template import ChatTemplate
from slotserver.server import ServerConfig, ServerState, create_app
from slotserver.server.anthropic.messages import normalize_billing
from slotserver.server.fields import Fields
from slotserver.server.formats.anthropic import AnthropicFormatter
from slotserver.server.generation import Outcome
from slotserver.server.openai_params import OpenAIJob
from slotserver.server.params import CompletionJob
from slotserver.server.reasoning import ReasoningMode
from slotserver.server.tools.request import parse_tools

KEY = "k-anthropic"
HELLO = [{"role": "user", "content": "Say hello"}]
WEATHER = {"name": "get_weather", "description": "Get the current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                            "required": ["city"]}}
ASK = [{"role": "user", "content": "What is the weather like in Paris?"}]
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}"
    "\n</think>\n\n{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking %}<think>\n{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def served():
    with smollm_client(n_parallel=2, ctx_size=2048, api_keys=(KEY,)) as (client, engine):
        client.headers["x-api-key"] = KEY
        yield client, engine


@pytest.fixture(scope="module")
def raw(served):
    return served[0]


@pytest.fixture(scope="module")
def sdk(raw):
    import anthropic   # here, not at the top: the SDK's import is ~2 s, which every test worker's collection would pay

    return anthropic.Anthropic(base_url="http://testserver", api_key=KEY, http_client=raw, max_retries=0)


@pytest.fixture(scope="module")
def thinker(served):
    """Raw client of a server state whose template thinks, on the same engine."""
    _, engine = served
    state = ServerState(ServerConfig(model_path=str(engine.bundle.config.model_path)))
    state.set_loaded(engine.bundle, engine, ChatTemplate(THINKING_TEMPLATE))
    with TestClient(create_app(state)) as client:
        yield client


GREEDY = {"extra_body": {"temperature": 0}}   # this SDK version has no `temperature` argument


def greedy(sdk, **kw):
    return sdk.messages.create(model="smol", **GREEDY, **{"max_tokens": 12, "messages": HELLO, **kw})


def count(client, **body) -> int:
    r = client.post("/v1/messages/count_tokens", json=body)
    assert r.status_code == 200, r.text
    assert list(r.json()) == ["input_tokens"]
    return r.json()["input_tokens"]


def events_of(text: str) -> list[tuple[str, dict]]:
    """(event name, data) of an Anthropic SSE body; checks each `event:` line names its data's type."""
    assert text.endswith("\n\n") and "[DONE]" not in text
    out = []
    for block in text[:-2].split("\n\n"):
        name_line, data_line = block.split("\n")
        name, data = name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert name_line.startswith("event: ") and data["type"] == name
        out.append((name, data))
    return out


def assert_error(r, status: int, *words: str) -> str:
    """`r` is Anthropic's error shape with this status; -> its message, which names `words`."""
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == {400: "invalid_request_error", 401: "authentication_error", 500: "api_error"}[status]
    assert all(w in body["error"]["message"] for w in words), body["error"]["message"]
    return body["error"]["message"]


# ---------------------------------------------------------------------------------------------
# plain messages


@pytest.fixture(scope="module")
def hello(sdk):
    """The greedy answer to HELLO (12 tokens at most), which several tests compare against."""
    return greedy(sdk, system="You are a friendly assistant.")


def test_basic_message_through_the_sdk(hello, raw):
    m = hello
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_") and m.model == "smol"
    assert len(m.content) == 1 and m.content[0].type == "text" and m.content[0].text.strip()
    assert m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None
    assert m.usage.output_tokens == 12 if m.stop_reason == "max_tokens" else 0 < m.usage.output_tokens < 12
    prompt = count(raw, system="You are a friendly assistant.", messages=HELLO)
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == prompt
    blocks = [{"type": "text", "text": "You are a friendly "}, {"type": "text", "text": "assistant."}]
    assert count(raw, system=blocks, messages=HELLO) == prompt   # system blocks are concatenated, as llama-server


def test_prompt_is_rendered_as_the_chat_route_renders_it(raw):
    turns = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there!"},
             {"role": "user", "content": [{"type": "text", "text": "How are"}, {"type": "text", "text": "you?"}]}]
    chat = raw.post("/v1/chat/completions", json={"messages": [{"role": "system", "content": "Be brief."}, *turns],
                                                  "max_tokens": 1})
    assert count(raw, system="Be brief.", messages=turns) == chat.json()["usage"]["prompt_tokens"]
    assert count(raw, messages=turns, max_tokens=5, temperature=0.5) == count(raw, messages=turns)


def test_stream_events_in_order_and_the_same_answer(sdk, raw, hello):
    system = "You are a friendly assistant."
    with sdk.messages.stream(model="smol", max_tokens=12, messages=HELLO, system=system, **GREEDY) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == hello.content[0].text and final.stop_reason == hello.stop_reason
    assert final.usage.output_tokens == hello.usage.output_tokens
    r = raw.post("/v1/messages", json={"max_tokens": 4, "temperature": 0, "messages": HELLO, "system": system,
                                       "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    names = [name for name, _ in events_of(r.text)]
    n = len(names)
    assert names == ["message_start", "content_block_start"] + ["content_block_delta"] * (n - 5) + \
        ["content_block_stop", "message_delta", "message_stop"] and n > 5
    data = [d for _, d in events_of(r.text)]
    assert {d["index"] for d in data[1:-2]} == {0}
    assert hello.content[0].text.startswith("".join(d["delta"]["text"] for d in data[2:-3]))
    assert data[0]["message"]["content"] == [] and data[0]["message"]["usage"]["input_tokens"] > 0
    assert data[-2]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert data[-2]["usage"]["output_tokens"] == 4


def test_stop_sequences_end_the_answer_and_are_named(sdk, raw, hello):
    text = hello.content[0].text
    word = text.split()[2]
    m = greedy(sdk, system="You are a friendly assistant.", stop_sequences=[word, "never-seen"])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == word
    assert m.content[0].text == text[:text.index(word)]
    r = raw.post("/v1/messages", json={"max_tokens": 12, "temperature": 0, "messages": HELLO, "stream": True,
                                       "system": "You are a friendly assistant.", "stop_sequences": [word]})
    assert events_of(r.text)[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": word}


# ---------------------------------------------------------------------------------------------
# tools


def test_tool_use_round_trip(sdk):
    m = sdk.messages.create(model="smol", max_tokens=60, messages=ASK, tools=[WEATHER], **GREEDY,
                            tool_choice={"type": "tool", "name": "get_weather"})
    assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["tool_use"]
    call = m.content[0]
    assert call.name == "get_weather" and call.input == {"city": "Paris"} and call.id.startswith("toolu_")
    history = ASK + [{"role": "assistant", "content": m.content},   # the SDK's blocks, sent back as they came
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                   "content": "Sunny, 24 degrees Celsius"}]}]
    answer = sdk.messages.create(model="smol", max_tokens=8, messages=history, tools=[WEATHER], **GREEDY,
                                 tool_choice={"type": "none"})
    assert answer.content[0].type == "text" and "sunny" in answer.content[0].text.lower()   # it read the result


def test_streamed_tool_use_gives_the_same_call(sdk):
    kw = dict(model="smol", max_tokens=60, **GREEDY, messages=ASK, tools=[WEATHER], tool_choice={"type": "any"})
    with sdk.messages.stream(**kw) as stream:
        kinds = [(e.type, getattr(e, "index", None)) for e in stream]
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and [b.type for b in final.content] == ["tool_use"]
    assert final.content[0].name == "get_weather" and final.content[0].input == {"city": "Paris"}
    assert ("content_block_start", 0) in kinds and ("content_block_stop", 0) in kinds


def test_tool_results_as_blocks_and_errors_render_like_strings(raw):
    def history(result: dict) -> list:
        use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}
        return ASK + [{"role": "assistant", "content": [use]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", **result}]}]
    plain = count(raw, messages=history({"content": "City not found"}), tools=[WEATHER])
    blocks = [{"type": "text", "text": "City not "}, {"type": "text", "text": "found"}]
    assert count(raw, messages=history({"content": blocks, "is_error": True}), tools=[WEATHER]) == plain
    assert count(raw, messages=history({"content": "City not found, try again"}), tools=[WEATHER]) > plain
    assert plain > count(raw, messages=history({"content": "City not found"}))   # the tools are described


# ---------------------------------------------------------------------------------------------
# thinking


def test_thinking_blocks_come_out_whole_and_streamed(thinker):
    body = {"max_tokens": 4, "temperature": 0, "messages": HELLO}
    m = thinker.post("/v1/messages", json=body).json()
    reasoning = thinker.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["reasoning_content"]
    assert m["content"] == [{"type": "thinking", "thinking": reasoning, "signature": ""}] and reasoning
    data = [d for _, d in events_of(thinker.post("/v1/messages", json={**body, "stream": True}).text)]
    assert data[1] == {"type": "content_block_start", "index": 0,
                       "content_block": {"type": "thinking", "thinking": "", "signature": ""}}
    deltas = [d["delta"] for d in data if d["type"] == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas) == reasoning
    assert deltas[-1] == {"type": "signature_delta", "signature": ""} and data[-3]["type"] == "content_block_stop"
    hidden = thinker.post("/v1/messages", json={**body, "thinking": {"type": "adaptive", "display": "omitted"}})
    assert hidden.json()["content"] == [{"type": "thinking", "thinking": "", "signature": ""}]


def test_thinking_switch_and_history_reach_the_template(thinker, raw):
    assert count(thinker, messages=HELLO, thinking={"type": "disabled"}) < count(thinker, messages=HELLO)
    said = [{"type": "thinking", "thinking": "The user wants a greeting.", "signature": "x"},
            {"type": "text", "text": "Hello!"}]
    turns = [*HELLO, {"role": "assistant", "content": said}, {"role": "user", "content": "Again"}]
    shorter = [*HELLO, {"role": "assistant", "content": said[1:]}, {"role": "user", "content": "Again"}]
    assert count(thinker, messages=turns) > count(thinker, messages=shorter)
    budget = {"type": "enabled", "budget_tokens": 50}
    ok = raw.post("/v1/messages", json={"max_tokens": 2, "messages": HELLO, "thinking": budget})   # no <think>
    assert ok.status_code == 200 and ok.json()["content"][0]["type"] == "text"


def test_thinking_budget_tokens_end_the_thinking_after_n_tokens(thinker):
    """budget_tokens becomes thinking_budget_tokens, as llama-server maps it: after N tokens of
    thinking `</think>` is forced and the answer follows in a text block."""
    body = {"max_tokens": 24, "temperature": 0, "messages": HELLO}
    free = thinker.post("/v1/chat/completions", json={**body, "logprobs": True}).json()["choices"][0]
    assert "content" in free["message"] and not free["message"]["content"]   # 24 tokens of thinking
    first = "".join(e["token"] for e in free["logprobs"]["content"][:3]).strip()
    m = thinker.post("/v1/messages", json={**body, "thinking": {"type": "enabled", "budget_tokens": 3}}).json()
    assert m["content"][0] == {"type": "thinking", "thinking": first, "signature": ""}
    assert m["content"][1]["type"] == "text" and m["content"][1]["text"]
    unbounded = thinker.post("/v1/messages", json={**body, "thinking": {"type": "enabled"}}).json()   # 10000
    assert [b["type"] for b in unbounded["content"]] == ["thinking"]


# ---------------------------------------------------------------------------------------------
# refusals and keys

IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}


@pytest.mark.parametrize("body, words", [
    ({"messages": HELLO}, ["'max_tokens' is required"]),
    ({"max_tokens": 5}, ["'messages' is required"]),
    ({"max_tokens": 5, "messages": "hi"}, ["'messages'"]),
    ({"max_tokens": 5, "messages": HELLO, "service_tier": "auto"}, ["'service_tier' is not supported"]),
    ({"max_tokens": 0, "messages": HELLO}, ["'max_tokens'"]),
    ({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, ["messages[0].role"]),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "video"}]}]}, ["'video'"]),
    ({"max_tokens": 5, "messages": HELLO, "stop_sequences": "END"}, ["'stop_sequences'"]),
    ({"max_tokens": 5, "messages": HELLO, "tools": [{**WEATHER, "type": "web_search_20250305"}]}, ["tools[0].type"]),
    ({"max_tokens": 5, "messages": HELLO, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "x"}}, ["'x'"]),
    ({"max_tokens": 5, "messages": HELLO, "metadata": {"user_id": 3}}, ["'user_id'"]),
    ({"max_tokens": 5, "messages": HELLO, "thinking": {"type": "sometimes"}}, ["'thinking'"]),
])
def test_bad_requests_are_400_in_anthropic_shape_naming_the_field(raw, body, words):
    assert_error(raw.post("/v1/messages", json=body), 400, *words)


def test_an_image_is_llama_servers_500_and_empty_messages_are_accepted(sdk, raw):
    """As llama-server answers (llama.cpp's test_compat_anthropic checks both): an image block to a
    text-only model is a 500 naming it, in Anthropic's error shape; `messages: []` generates."""
    assert_error(raw.post("/v1/messages", json={"max_tokens": 5, "messages": [{"role": "user", "content": [IMAGE]}]}),
                 500, "messages[0].content[0]", "image input is not supported")
    import anthropic

    with pytest.raises(anthropic.InternalServerError, match="image input is not supported"):
        sdk.with_options(max_retries=0).messages.create(model="smol", max_tokens=5,
                                                        messages=[{"role": "user", "content": [IMAGE]}])
    empty = raw.post("/v1/messages", json={"max_tokens": 3, "messages": [], "temperature": 0})
    assert empty.status_code == 200 and empty.json()["type"] == "message", empty.text
    assert empty.json()["usage"]["output_tokens"] >= 1


def test_sdk_raises_bad_request_with_the_message(sdk, raw):
    import anthropic

    with pytest.raises(anthropic.BadRequestError, match="'video'"):
        sdk.messages.create(model="smol", max_tokens=5, messages=[{"role": "user", "content": [{"type": "video"}]}])
    assert_error(raw.post("/v1/messages", content=b"{not json"), 400)
    assert_error(raw.post("/v1/messages/count_tokens", json={"messages": "hi"}), 400, "'messages'")
    assert raw.post("/v1/messages", json={"max_tokens": 1, "messages": HELLO, "metadata": {"user_id": "u1"}}).status_code == 200


def test_api_key_from_x_api_key_or_bearer(raw, served):
    import anthropic

    wrong = anthropic.Anthropic(base_url="http://testserver", api_key="nope", http_client=TestClient(raw.app),
                                max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model="smol", max_tokens=1, messages=HELLO)
    bare = TestClient(raw.app)
    assert_error(bare.post("/v1/messages/count_tokens", json={"messages": HELLO}), 401, "Invalid API Key")
    assert bare.post("/v1/messages/count_tokens", json={"messages": HELLO}, headers={"x-api-key": KEY}).status_code == 200
    both = {"Authorization": "Bearer proxy-token", "x-api-key": KEY}
    assert bare.post("/v1/messages/count_tokens", json={"messages": HELLO}, headers=both).status_code == 200
    assert bare.post("/tokenize", json={"content": "x"}, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert bare.post("/tokenize", json={"content": "x"}).json()["error"]["code"] == 401   # llama-server's shape there


def test_claude_codes_billing_stamp_is_normalized_for_the_prompt_cache():
    head = "x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; cch=a5145;"
    assert normalize_billing(head + "You are Claude Code.") == head.replace("a5145", "fffff") + "You are Claude Code."
    for other in ("You are helpful. cch=a5145;", head[:-1]):   # not the header, or no ';' after the stamp
        assert normalize_billing(other) == other


# ---------------------------------------------------------------------------------------------
# the stream formatter on its own: any answer streams as the same blocks, one open at a time


def _formatter(**tools_body) -> AnthropicFormatter:
    tools = parse_tools(Fields({"tools": [{"type": "function", "function": {
        "name": "get_weather", "parameters": WEATHER["input_schema"]}}], **tools_body}))
    job = OpenAIJob([CompletionJob(Request(prompt_ids=(1, 2, 3)))], "m", [""], tools, ReasoningMode("auto"))
    return AnthropicFormatter(job)


FINAL = FinalEvent(stop_type="eos", stopping_word="", truncated=False, id_slot=0, n_prompt=3, n_cached=1,
                   n_predicted=9, prompt_ms=1.0, predicted_ms=1.0, seed=0)
ANSWER = '<think>\nCheck the weather.\n</think>\n\nLet me look.\n<tool_call>\n{"name": "get_weather", ' \
         '"arguments": {"city": "Oslo"}}\n</tool_call>'


@pytest.mark.parametrize("step", [1, 3, 7, len(ANSWER)])
def test_streamed_blocks_match_the_whole_answer(step):
    fmt = _formatter()
    chunks = [fmt.stream_start()]
    for i in range(0, len(ANSWER), step):
        chunks += fmt.stream_text(ANSWER[i:i + step])
    chunks += fmt.stream_end(FINAL)
    events = [d for _, d in events_of(b"".join(chunks).decode())]
    blocks: list[dict] = []
    open_now = None
    for e in events:
        if e["type"] == "content_block_start":
            assert open_now is None and e["index"] == len(blocks)
            blocks.append(dict(e["content_block"]))
            open_now = e["index"]
        elif e["type"] == "content_block_delta":
            d, b = e["delta"], blocks[e["index"]]
            assert e["index"] == open_now
            if d["type"] == "input_json_delta":
                b["input"] = json.loads(d["partial_json"])
            elif d["type"] != "signature_delta":
                key = d["type"].removesuffix("_delta")
                b[key] += d[key]
        elif e["type"] == "content_block_stop":
            assert e["index"] == open_now
            open_now = None
    whole = _formatter().full(Outcome(text=ANSWER, final=FINAL))
    for b, w in zip(blocks, whole["content"]):
        b["id"] = w["id"] = w.get("id")
        if b["type"] == "text":   # a whole answer's text is stripped around calls (calls.py), a stream's cannot be
            b["text"] = b["text"].strip()
    assert blocks == whole["content"] and [b["type"] for b in blocks] == ["thinking", "text", "tool_use"]
    assert whole["stop_reason"] == "tool_use" and events[-2]["delta"]["stop_reason"] == "tool_use"
    assert whole["usage"] == events[-2]["usage"] == {"input_tokens": 2, "cache_read_input_tokens": 1, "output_tokens": 9}
