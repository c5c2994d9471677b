"""llama-server details its own tests check, on the tiny model: the metrics' exact names and
types, prompt progress and per-token timings in streams, the generation rate over n - 1 tokens,
continue_final_message, ignore_eos in generation_settings, idle /slots, --kv-unified's mapping, and
that a seed draws llama.cpp's own uniforms."""

from __future__ import annotations

import json

import pytest

from slotserver.cli.main import build_parser
from slotserver.model.sampling.sampler import SequenceRng
from slotserver.model.text.chat_template import CHATML_TEMPLATE, ChatTemplate
from slotserver.server.config_from_args import _unified
from slotserver.server.tools.prompt import render_with_tools
from test_server_api import client, make_client, sse_events, tiny_engine  # noqa: F401  fixtures

# `std::mt19937 r(42); std::uniform_real_distribution<double> d(0.0f, 1.0f);` printed with %.17g
# by g++ 12 / libstdc++ (the draws llama.cpp's dist sampler makes for seed 42)
LIBSTDCXX_SEED_42 = (0.79654298428784598, 0.18343478789336848, 0.77969099761266125, 0.59685016158005655)


def test_a_seed_draws_llama_cpps_uniforms():
    rng = SequenceRng(42)
    assert tuple(rng.next_uniform() for _ in range(4)) == pytest.approx(LIBSTDCXX_SEED_42, rel=0, abs=1e-16)


def test_llamacpp_metrics_have_llama_servers_names_types_and_header(client):  # noqa: F811
    r1 = client.post("/completion", json={"prompt": "the cat sat", "n_predict": 3, "temperature": 0}).json()
    r2 = client.post("/completion", json={"prompt": "the cat sat", "n_predict": 3, "temperature": 0}).json()
    r = client.get("/metrics")
    assert int(r.headers["Process-Start-Time-Unix"]) > 0
    types = dict(line.split(" ")[2:4] for line in r.text.splitlines() if line.startswith("# TYPE llamacpp:"))
    values = {k: float(v) for k, v in (line.split(" ") for line in r.text.splitlines()
                                       if line.startswith("llamacpp:"))}
    for name in ("prompt_tokens_total", "prompt_tokens_cached_total", "tokens_predicted_total", "n_decode_total",
                 "n_tokens_max", "spec_decode_num_drafts_total"):
        assert types[f"llamacpp:{name}"] == "counter" and f"# HELP llamacpp:{name} " in r.text
    for name in ("prompt_tokens_seconds", "predicted_tokens_seconds", "requests_processing", "requests_deferred"):
        assert types[f"llamacpp:{name}"] == "gauge"
    assert values["llamacpp:tokens_predicted_total"] >= 6
    assert values["llamacpp:prompt_tokens_cached_total"] >= r2["timings"]["cache_n"] > 0
    assert r1["timings"]["predicted_per_second"] == pytest.approx(2e3 / r1["timings"]["predicted_ms"])


def test_return_progress_and_timings_per_token_in_streams(client):  # noqa: F811
    body = {"prompt": "one two three four five six seven eight nine ten " * 1, "n_predict": 3, "stream": True,
            "return_progress": True, "timings_per_token": True, "cache_prompt": False}
    chunks = [json.loads(e) for e in sse_events(client.post("/completion", json=body).text)]
    progress = [c for c in chunks if "prompt_progress" in c]
    assert progress[0]["timings"]["prompt_n"] == 0 and progress[0]["timings"]["prompt_ms"] == 0.0
    assert progress[-1]["prompt_progress"]["processed"] == progress[-1]["prompt_progress"]["total"]
    tokens = [c for c in chunks if c.get("tokens")]
    assert tokens and all("timings" in c for c in tokens)
    assert [c["timings"]["predicted_n"] for c in tokens] == sorted(c["timings"]["predicted_n"] for c in tokens)


def test_chat_usage_chunk_carries_timings_and_role_chunk_has_null_content(client):  # noqa: F811
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True, "temperature": 0,
            "ignore_eos": True, "stream_options": {"include_usage": True}}   # greedy, 3 tokens whatever they are
    chunks = [json.loads(e) for e in sse_events(client.post("/v1/chat/completions", json=body).text)[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert chunks[-1]["choices"] == [] and chunks[-1]["timings"]["predicted_n"] == 3


def test_continue_final_message_ends_the_prompt_inside_the_last_message():
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]
    text = render_with_tools(ChatTemplate(CHATML_TEMPLATE), msgs, None, False, True)
    assert text.endswith("<|im_start|>assistant\nHel")


def test_ignore_eos_lists_the_end_of_generation_biases(client, tiny_engine):  # noqa: F811
    eog = sorted(tiny_engine[0].tokenizer.eog_ids)
    body = {"prompt": "hi", "n_predict": 2, "ignore_eos": True, "logit_bias": [[5, 1.5]]}
    bias = client.post("/completion", json=body).json()["generation_settings"]["logit_bias"]
    assert bias == [{"bias": 1.5, "token": 5}] + [{"bias": None, "token": t} for t in eog]


def test_idle_slots_keep_nothing_of_their_last_task(client):  # noqa: F811
    client.post("/completion", json={"prompt": "hi", "n_predict": 4})
    for slot in client.get("/slots").json():
        assert slot["is_processing"] is False
        assert slot["next_token"][0]["n_remain"] == -1 and slot["next_token"][0]["n_decoded"] == 0


def test_kv_unified_gives_every_slot_the_whole_context_in_one_paged_pool():
    parse = build_parser().parse_args
    args = parse(["serve", "-kvu", "-c", "256", "-np", "4"])    # llama-server's spelling
    assert _unified(args) == (1024, 256, "paged")     # 4 slots of 256 cells, one pool of 256
    assert _unified(parse(["serve", "--kv-unified", "-c", "256", "-np", "4"])) == (1024, 256, "paged")
    assert _unified(parse(["serve", "-c", "256", "-np", "4"]))[:2] == (256, None)


def test_cache_type_flags_choose_the_kv_element_type():
    """-ctk/-ctv as llama-server spells them: f16 by default under --dtype auto (llama.cpp's default
    cache type), the model's dtype in the float32 reference mode; one type for K and V."""
    from types import SimpleNamespace

    import torch

    from slotserver.engine.config import EngineConfig
    from slotserver.engine.engine_setup import kv_dtype
    from slotserver.errors import ConfigError
    from slotserver.server.config_from_args import plan_from_args

    parse = build_parser().parse_args
    assert plan_from_args(parse(["serve"])).engine.cache_type == "auto"
    assert plan_from_args(parse(["serve", "-ctk", "f32", "-ctv", "f32"])).engine.cache_type == "f32"
    assert plan_from_args(parse(["serve", "--cache-type-v", "bf16"])).engine.cache_type == "bf16"
    with pytest.raises(ConfigError, match="differ"):
        plan_from_args(parse(["serve", "-ctk", "f16", "-ctv", "f32"]))
    with pytest.raises(ConfigError, match="q8"):
        plan_from_args(parse(["serve", "-ctk", "q4_0", "-ctv", "q4_0"]))
    served = SimpleNamespace(config=SimpleNamespace(dtype="auto"), model=SimpleNamespace(dtype=torch.float32))
    reference = SimpleNamespace(config=SimpleNamespace(dtype="float32"), model=SimpleNamespace(dtype=torch.float32))
    assert kv_dtype(EngineConfig(), served) == torch.float16
    assert kv_dtype(EngineConfig(), reference) == torch.float32
    assert kv_dtype(EngineConfig(cache_type="f32"), served) == torch.float32
