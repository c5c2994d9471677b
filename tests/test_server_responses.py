"""OpenAI's Responses API (POST /v1/responses) end to end through HTTP: the official `openai` SDK
(`responses.create`, streamed too, and its `responses.stream` helper, which checks the events'
ids and indexes as it rebuilds the answer) and raw SSE.

The tiny random model answers through a forced GBNF grammar (a llama-server field the route
passes on), so the text is known; forced tool_choice and text.format make its calls and JSON
come from their schemas. Inputs are checked against the chat route: a Responses history must
render the prompt, and give the answer, of the equivalent chat messages.
"""

from __future__ import annotations

import json

import pytest
from openai import BadRequestError, OpenAI
from starlette.testclient import TestClient
from test_server_api import assert_error
from tiny_engine import running_tiny_engine

from slotserver.model.text.chat_template import ChatTemplate
from slotserver.server import ServerConfig, ServerState, create_app

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.reasoning_content %}<think>"
            "{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "required": ["city"], "additionalProperties": False,
                          "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}}}
ANSWER = "<think>\nThe user wants a capital.\n</think>\n\nParis."
GREEDY = {"temperature": 0, "max_output_tokens": 120}


def forced(text: str) -> dict:
    return {"grammar": "root ::= " + json.dumps(text)}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with running_tiny_engine(tmp_path_factory.mktemp("tiny"), 2, 4096, **{"llama.context_length": 2048}) \
            as (bundle, engine):
        state = ServerState(ServerConfig(model_path=str(bundle.config.model_path)))
        state.set_loaded(bundle, engine, ChatTemplate(TEMPLATE))
        with TestClient(create_app(state)) as c:
            yield c


@pytest.fixture(scope="module")
def oai(client):
    return OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client, max_retries=0)


def frames(text: str) -> list[dict]:
    """The events of a Responses stream, checking the framing: `event: <type>` then `data: {...}`
    whose `type` is that event's name; no `[DONE]`."""
    assert text.endswith("\n\n") and "[DONE]" not in text
    events = []
    for block in text[:-2].split("\n\n"):
        name, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == "event: " + event["type"]
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def stream(client, **body) -> list[dict]:
    r = client.post("/v1/responses", json={"stream": True, **GREEDY, **body})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
    return frames(r.text)


def test_string_input_answers_a_message_with_usage(client, oai):
    r = oai.responses.create(model="m", input="Capital of France?", extra_body=forced("Paris."), **GREEDY)
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert r.output_text == "Paris." and len(r.output) == 1
    item = r.output[0]
    assert item.type == "message" and item.id.startswith("msg_") and item.role == "assistant"
    assert item.content[0].type == "output_text" and item.content[0].text == "Paris."
    chat = chat_twin(client, [{"role": "user", "content": "Capital of France?"}], **forced("Paris."))["usage"]
    assert (r.usage.input_tokens, r.usage.output_tokens) == (chat["prompt_tokens"], chat["completion_tokens"])
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.temperature == 0 and r.max_output_tokens == 120 and r.store is False


def chat_twin(client, messages: list, **extra) -> dict:
    body = {"messages": messages, "temperature": 0, "max_tokens": 12, **extra}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def assert_same_as_chat(client, oai, items: list, messages: list, **extra) -> None:
    """The Responses input renders the chat messages' prompt: same prompt tokens, same greedy text."""
    r = oai.responses.create(model="m", input=items, temperature=0, max_output_tokens=12, **extra)
    chat = chat_twin(client, messages, **extra)
    assert r.usage.input_tokens == chat["usage"]["prompt_tokens"]
    assert r.output_text == chat["choices"][0]["message"]["content"]
    counted = oai.responses.input_tokens.count(model="m", input=items, **extra)
    assert counted.input_tokens == r.usage.input_tokens


def test_items_and_instructions_render_as_the_chat_messages(client, oai):
    parts = [{"type": "input_text", "text": "Hi"}, {"type": "input_text", "text": "there"}]
    thought = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Greet."}]}
    items = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": parts}, thought,
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
             {"role": "user", "content": "Capital of France?"}]
    messages = [{"role": "system", "content": "Answer in French."}, {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi\nthere"},
                {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet."},
                {"role": "user", "content": "Capital of France?"}]
    assert_same_as_chat(client, oai, items, messages[1:])
    r = oai.responses.create(model="m", input=items, instructions="Answer in French.", max_output_tokens=1)
    assert r.usage.input_tokens == chat_twin(client, messages, max_tokens=1)["usage"]["prompt_tokens"]
    assert r.instructions == "Answer in French."


def test_function_call_history_renders_as_chat_tool_messages(client, oai):
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'}
    thought = {"type": "reasoning", "id": "rs_1", "summary": [],
               "content": [{"type": "reasoning_text", "text": "Ask."}]}
    result = {"type": "function_call_output", "call_id": "call_1", "output": "22 C, sunny"}
    items = [{"role": "user", "content": "Weather in Paris?"}, thought, call, result]
    chat_call = {"id": "call_1", "type": "function", "function": {k: call[k] for k in ("name", "arguments")}}
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "reasoning_content": "Ask.", "tool_calls": [chat_call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "22 C, sunny"}]
    assert_same_as_chat(client, oai, items, messages)
    chat_tools = [{"type": "function", "function": {"name": "get_weather", "description": WEATHER["description"],
                                                    "parameters": WEATHER["parameters"], "strict": True}}]
    r = oai.responses.create(model="m", input=items, tools=[WEATHER], max_output_tokens=1)
    chat = chat_twin(client, messages, tools=chat_tools, max_tokens=1)
    assert r.usage.input_tokens == chat["usage"]["prompt_tokens"]
    longer = [*items[:-1], {**items[-1], "output": "22 C, sunny, no wind"}]   # the output reaches the prompt
    assert oai.responses.input_tokens.count(model="m", input=longer, tools=[WEATHER]).input_tokens \
        > r.usage.input_tokens


def test_forced_tool_choice_gives_a_function_call_item(oai):
    r = oai.responses.create(model="m", input="Weather in Paris?", tools=[WEATHER], **GREEDY,
                             tool_choice={"type": "function", "name": "get_weather"})
    assert [i.type for i in r.output] == ["function_call"] and r.output_text == ""
    call = r.output[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.id == "fc_" + call.call_id[5:]
    assert json.loads(call.arguments)["city"] in ("Paris", "Rome") and call.status == "completed"
    assert r.tool_choice.name == "get_weather" and r.tools[0].name == "get_weather" and r.tools[0].strict


def test_allowed_tools_offer_only_the_listed_functions(oai):
    time = {**WEATHER, "name": "get_time", "description": "The time in a city"}
    choice = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_time"}]}
    r = oai.responses.create(model="m", input="Time in Paris?", tools=[WEATHER, time], tool_choice=choice, **GREEDY)
    assert [(i.type, i.name) for i in r.output] == [("function_call", "get_time")]


def test_streamed_tool_call_events_rebuild_the_same_call(client, oai):
    kw = dict(input="Weather in Paris?", tools=[WEATHER], tool_choice="required")
    whole = oai.responses.create(model="m", **kw, **GREEDY).output[0]
    events = stream(client, **kw)
    kinds = [e["type"] for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done", "response.completed"]
    added, delta, done, item_done = events[2:6]
    assert added["item"]["arguments"] == "" and added["item"]["name"] == "get_weather"
    assert delta["item_id"] == done["item_id"] == added["item"]["id"] == item_done["item"]["id"]
    assert delta["delta"] == done["arguments"] == item_done["item"]["arguments"] == whole.arguments
    assert events[-1]["response"]["output"] == [item_done["item"]]


def test_stream_event_order_ids_and_text(client):
    events = stream(client, input="Capital of France?", **forced("Paris."))
    kinds = [e["type"] for e in events]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert kinds == (["response.created", "response.in_progress", "response.output_item.added",
                      "response.content_part.added"] + ["response.output_text.delta"] * len(deltas)
                     + ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                        "response.completed"])
    rid = events[0]["response"]["id"]
    assert events[0]["response"]["status"] == "in_progress" and events[-1]["response"]["id"] == rid
    item_id = events[2]["item"]["id"]
    assert all(e["item_id"] == item_id and e["output_index"] == 0 for e in events[3:-2])
    assert "".join(d["delta"] for d in deltas) == events[-4]["text"] == "Paris."
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["output"][0]["content"][0]["text"] == "Paris."
    assert final["usage"]["output_tokens"] == events[-1]["timings"]["predicted_n"] > 0


def test_sdk_stream_deltas_add_up_to_the_completed_response(oai):
    events = list(oai.responses.create(model="m", input="Capital?", stream=True, extra_body=forced("Paris."), **GREEDY))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text == "Paris." and events[-1].response.id == events[0].response.id


def test_reasoning_comes_as_a_reasoning_item_whole_and_streamed(oai):
    r = oai.responses.create(model="m", input="Capital of France?", extra_body=forced(ANSWER), **GREEDY)
    assert [i.type for i in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == "The user wants a capital." and r.output[0].id.startswith("rs_")
    assert r.output_text == "Paris." and 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens
    with oai.responses.stream(model="m", input="Capital of France?", extra_body=forced(ANSWER), **GREEDY) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_item.done") \
        < kinds.index("response.output_text.delta")   # the reasoning item closes before the message opens
    assert [i.type for i in final.output] == ["reasoning", "message"] and final.output_text == "Paris."
    assert final.output[0].content[0].text == "The user wants a capital."


def test_text_format_json_schema_is_enforced(oai):
    schema = {"type": "object", "required": ["city", "sunny"], "additionalProperties": False,
              "properties": {"city": {"enum": ["Paris", "Rome"]}, "sunny": {"type": "boolean"}}}
    fmt = {"format": {"type": "json_schema", "name": "weather", "schema": schema, "strict": True}}
    r = oai.responses.create(model="m", input="Weather?", text=fmt, temperature=1.0, top_p=1.0,
                             max_output_tokens=60, extra_body={"seed": 3})
    value = json.loads(r.output_text)
    assert set(value) == {"city", "sunny"} and value["city"] in ("Paris", "Rome") and isinstance(value["sunny"], bool)
    assert r.text.format.type == "json_schema" and r.text.format.name == "weather"
    r = oai.responses.create(model="m", input="Weather?", text={"format": {"type": "json_object"}}, temperature=0,
                             max_output_tokens=60)
    assert r.status == "incomplete" or isinstance(json.loads(r.output_text), dict)


def test_max_output_tokens_makes_the_response_incomplete(client, oai):
    r = oai.responses.create(model="m", input="Capital of France?", temperature=0, max_output_tokens=3,
                             extra_body=forced("Paris is the capital."))
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert "Paris is the capital.".startswith(r.output_text) and r.output_text != "Paris is the capital."
    assert r.usage.output_tokens == 3 and r.output[0].status == "incomplete"
    events = stream(client, input="Capital of France?", max_output_tokens=3, **forced("Paris is the capital."))
    last = events[-1]
    assert last["type"] == "response.completed"   # as llama-server ends every stream
    assert last["response"]["status"] == "incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_logprobs_through_include(oai):
    r = oai.responses.create(model="m", input="Capital?", include=["message.output_text.logprobs"], top_logprobs=2,
                             extra_body=forced("Paris."), **GREEDY)
    lps = r.output[0].content[0].logprobs
    assert "".join(lp.token for lp in lps) == "Paris." and len(lps) == r.usage.output_tokens
    assert all(lp.logprob <= 0 and len(lp.top_logprobs) == 2 for lp in lps)


def test_llama_telemetry_in_the_stream(client):
    """llama.cpp's test_responses_stream_with_llama_telemetry, in short."""
    events = stream(client, input="This is a test " * 10, max_output_tokens=4, timings_per_token=True,
                    return_progress=True, cache_prompt=False, **forced("Paris is the capital."))
    progress = [e for e in events if "prompt_progress" in e]
    assert progress and all(e["type"] == "response.in_progress" for e in progress)
    assert progress[-1]["prompt_progress"]["processed"] == progress[-1]["prompt_progress"]["total"]
    assert any(e["type"] == "response.output_text.delta" and "predicted_per_second" in e.get("timings", {})
               for e in events)
    assert events[-1]["type"] == "response.completed" and "timings" in events[-1]


def test_obfuscation_pads_deltas_only_when_asked(client):
    padded = stream(client, input="hi", stream_options={"include_obfuscation": True}, **forced("Paris."))
    assert all("obfuscation" in e for e in padded if e["type"].endswith(".delta"))
    plain = stream(client, input="hi", **forced("Paris."))
    assert not any("obfuscation" in e for e in plain)


@pytest.mark.parametrize("extra, named", [
    ({"previous_response_id": "resp_123"}, "previous_response_id"),
    ({"store": True}, "store"),
    ({"background": True}, "background"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"truncation": "auto"}, "truncation"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}}, "text.format"),
    ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"reasoning": {"summary": "detailed"}}, "reasoning.summary"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content[0]"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
    ({"include": ["everything"]}, "include"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "messages"),
    ({"n": 2}, "'n'"),
    ({"input": []}, "'input'"),
    ({"tool_choice": {"type": "allowed_tools", "tools": [{"type": "function", "name": "nope"}]},
      "tools": [WEATHER]}, "tool_choice.tools"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
])
def test_what_cannot_be_honoured_is_a_400_naming_the_field(client, extra, named):
    err = assert_error(client.post("/v1/responses", json={"input": "hi", **extra}), 400)
    assert named in err["message"]


def test_the_sdk_sees_refusals_and_stateless_ids(client, oai):
    with pytest.raises(BadRequestError, match="store"):
        oai.responses.create(model="m", input="hi", store=True)
    r = oai.responses.create(model="m", input="hi", store=False, metadata={"k": "v"}, user="u1",
                             max_output_tokens=2, extra_body=forced("ok"))
    assert r.store is False and r.metadata == {"k": "v"} and r.user == "u1"
    assert "stores no responses" in assert_error(client.get(f"/v1/responses/{r.id}"), 404)["message"]
    assert client.post("/responses", json={"input": "hi", "max_output_tokens": 2, **forced("ok")}).json()["status"] \
        == "completed"

