"""Chat messages over HTTP as llama-server takes them: OpenAI content parts on every role, media
parts refused by name, system messages merged for templates without a system role, one BOS in a
gemma 3 chat prompt (the tiny gemma3 model with a BOS-adding tokenizer and gemma 3's template),
and prompts echoed with their special tokens as text."""

from __future__ import annotations

import json

import gguf
import pytest
import torch
from starlette.testclient import TestClient

from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ModelConfig
from slotserver.model.text.chat_template import CHATML_TEMPLATE, ChatTemplate
from slotserver.server import ServerConfig, ServerState, create_app
from slotserver.server.launch import LaunchPlan, load
from test_server_api import assert_error, client, tiny_engine  # noqa: F401  fixtures
from tiny_gguf import write_tiny_gguf
from tokenizer_fixtures import FOLDER

SOURCES = {c["name"]: c["source"] for c in json.loads((FOLDER / "templates.json").read_text())["cases"]}
CALL = {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "{\"tz\": \"UTC\"}"}}
U32 = gguf.GGUFValueType.UINT32


def _parts(*texts: str) -> list[dict]:
    return [{"type": "text", "text": t} for t in texts]


def _client(engine_pair, template: ChatTemplate | None = None) -> TestClient:
    bundle, engine = engine_pair
    state = ServerState(ServerConfig(model_path=str(bundle.config.model_path)))
    state.set_loaded(bundle, engine, template)
    return TestClient(create_app(state))


def _prompt(c: TestClient, messages: list) -> str:
    r = c.post("/apply-template", json={"messages": messages})
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


@pytest.fixture(scope="module")
def gemma_engine(tmp_path_factory):
    """tests/fixtures/archs/gemma3.gguf's recipe (playground/make_arch_fixtures.py), its tokenizer
    adding BOS and gemma 3's template writing `{{ bos_token }}` too, as real gemma 3 files do."""
    threads = torch.get_num_threads()
    path = write_tiny_gguf(tmp_path_factory.mktemp("gemma") / "gemma3.gguf", arch="gemma3", n_layers=6, head_dim=16,
                           rope_base=1e6, features=("qk_norm", "post_norms"), d_model=32, n_heads=4, n_kv_heads=2,
                           d_ff=64, ctx_len=512, chat_template=SOURCES["gemma3"],
                           **{"gemma3.attention.sliding_window": (4, U32), "gemma3.final_logit_softcapping": 8.0,
                              "tokenizer.ggml.add_bos_token": True})
    bundle = ModelBundle.load(ModelConfig(path, threads=1))
    engine = Engine(bundle, EngineConfig(n_parallel=1, ctx_size=128)).start()
    yield bundle, engine
    engine.stop()
    torch.set_num_threads(threads)


def test_gemma3_chat_prompt_starts_with_one_bos(gemma_engine):
    tok = gemma_engine[0].tokenizer
    bos = tok.decode([tok.bos_id], special=True)
    with _client(gemma_engine) as c:
        prompt = _prompt(c, [{"role": "user", "content": "Hi"}])
        assert prompt == "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"   # llama-server's cut
        ids = c.post("/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"]
        assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1
        chat = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                    "max_tokens": 1, "temperature": 0}).json()
        assert chat["usage"]["prompt_tokens"] == len(ids)
        echoed = c.post("/completion", json={"prompt": prompt, "n_predict": 1, "temperature": 0}).json()["prompt"]
        assert echoed == bos + prompt    # the BOS the tokenizer added, shown as text, once


def test_gemma3_keeps_content_parts_and_trims_each_one(gemma_engine):
    with _client(gemma_engine) as c:
        assert _prompt(c, [{"role": "user", "content": _parts(" parts ", "two")}]) == \
            "<start_of_turn>user\npartstwo<end_of_turn>\n<start_of_turn>model\n"
        assert c.get("/props").json()["chat_template_caps"]["supports_typed_content"] is True


@pytest.mark.parametrize("template", ["chatml", "qwen2.5"])
def test_content_parts_on_every_role_read_as_their_joined_text(tiny_engine, template):   # noqa: F811
    """ChatML (no tool support: the Hermes fallback writes tool messages) and Qwen 2.5 (renders
    tools and tool messages itself) take strings only: parts are joined with newlines."""
    def conversation(content) -> list[dict]:
        return [{"role": "system", "content": content("Be terse.", "Be kind.")},
                {"role": "user", "content": content("What time", "is it?")},
                {"role": "assistant", "content": content("Checking", "the clock."), "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "c1", "content": content("12:00", "UTC")}]
    joined = conversation(lambda *t: "\n".join(t))
    with _client(tiny_engine, None if template == "chatml" else ChatTemplate(SOURCES[template])) as c:
        assert _prompt(c, conversation(_parts)) == _prompt(c, joined)
        assert "12:00\nUTC" in _prompt(c, joined)
        if template == "chatml":   # (Qwen's default system prompt alone is past the tiny context)
            r = c.post("/v1/chat/completions", json={"messages": conversation(_parts)[1:2], "max_tokens": 2})
            assert r.status_code == 200, r.text


@pytest.mark.parametrize("role", ["system", "user", "assistant", "tool"])
@pytest.mark.parametrize(("part", "named"), [
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}, "image_url"),
    ({"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}, "input_audio"),
])
def test_media_parts_are_a_400_naming_them(client, role, part, named):   # noqa: F811
    messages = [{"role": "user", "content": "hi"}, {"role": role, "content": [*_parts("see"), part]}]
    for path in ("/v1/chat/completions", "/apply-template"):
        err = assert_error(client.post(path, json={"messages": messages, "max_tokens": 1}), 400)
        assert named in err["message"] and "messages[1].content[1]" in err["message"]


def test_templates_without_a_system_role_get_it_merged_into_the_first_user_turn(tiny_engine):   # noqa: F811
    system = [{"role": "system", "content": "Terse."}, {"role": "user", "content": "Hi"}]
    with _client(tiny_engine, ChatTemplate(SOURCES["gemma2"], "<bos>")) as c:   # raises on a system role
        assert _prompt(c, system) == "<bos><start_of_turn>user\nTerse.\nHi<end_of_turn>\n<start_of_turn>model\n"
        assert c.get("/props").json()["chat_template_caps"]["supports_system_role"] is False
        r = c.post("/v1/chat/completions", json={"messages": system, "max_tokens": 1})
        assert r.status_code == 200, r.text
    with _client(tiny_engine, ChatTemplate(SOURCES["mistral-v0.1"])) as c:   # strict alternation
        assert _prompt(c, system) == "[INST] Terse.\nHi [/INST]"
        twice = [{"role": "user", "content": "A"}, {"role": "user", "content": "B"}]
        assert "must alternate" in assert_error(c.post("/apply-template", json={"messages": twice}), 400)["message"]


def test_completion_echoes_the_prompt_as_llama_detokenize_shows_it(client):   # noqa: F811
    """Special tokens as text and llama.cpp's space clean-up (" ?" -> "?"), as llama-server's
    `common_detokenize(ctx, tokens, true)`; /detokenize keeps the pieces as they are. (llama-server
    echoes "<|im_start|>Hello? it's ok!" for "<|im_start|>Hello ? it 's ok !" on the tiny
    tests/fixtures/archs/qwen3.gguf, and the text as sent on SmolLM2, whose pre-tokenizer keeps spaces.)"""
    body = {"prompt": "<|im_start|>Hello ? it 's", "n_predict": 1, "temperature": 0}
    assert client.post("/completion", json=body).json()["prompt"] == "<|im_start|>Hello? it's"
    ids = client.post("/tokenize", json={"content": body["prompt"]}).json()["tokens"]
    assert client.post("/detokenize", json={"tokens": ids}).json()["content"] == body["prompt"]


def test_a_model_without_a_template_is_served_chatml_with_a_warning(tmp_path, capsys):
    """The gemma-3-270m report: that GGUF carries no tokenizer.chat_template, so its chat prompts
    are ChatML, in llama-server too; the server says so at load and names the way out."""
    path, threads = write_tiny_gguf(tmp_path / "bare.gguf", **{"tokenizer.chat_template": None}), torch.get_num_threads()
    engine = EngineConfig(n_parallel=1, ctx_size=64)
    state = ServerState(ServerConfig(model_path=str(path)))
    try:
        load(state, LaunchPlan(ModelConfig(path, threads=1), engine, watch=False), "http://test")
        assert "bare.gguf has no chat template" in capsys.readouterr().err
        assert state.template.source == CHATML_TEMPLATE
        load(state, LaunchPlan(ModelConfig(path, threads=1), engine, chat_template=SOURCES["gemma3"], watch=False),
             "http://test")
    finally:
        torch.set_num_threads(threads)
    assert "no chat template" not in capsys.readouterr().err
    assert state.template.source == SOURCES["gemma3"] and state.template.bos_token == "<|endoftext|>"
