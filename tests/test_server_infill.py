"""POST /infill on tiny models with FIM tokens: llama-server's prompt layout (as the `prompt` text
and `tokens_evaluated` a client reads back), its budgets (-b 64: prefix 48, suffix 14 - prompt;
extra n_ctx - 64 - 2 * -n), --spm-infill, BOS, the snippet form without FIM_SEP, its errors, and
that generation is /completion's on that prompt (greedy, seeded, streamed).

Digits are one token each in the tiny vocabulary (no merge touches them), so token budgets are
character counts here. The comparison with llama-server itself: playground/infill_vs_llama.py.
"""

from __future__ import annotations

import contextlib
import json

import gguf
import pytest
import torch

from slotserver.cli import main as cli
from slotserver.engine.config import EngineConfig
from slotserver.engine.engine import Engine
from slotserver.model.bundle import ModelBundle
from slotserver.model.config import ConfigError, ModelConfig
from slotserver.server.config import GenerationDefaults, ServerConfig
from slotserver.server.config_from_args import server_config_from_args
from test_server_api import assert_error, make_client, sse_events
from tiny_gguf import FIM_SPECIALS, tiny_vocab, write_tiny_gguf

HEAD = "<|repo_name|>myproject\n"      # FIM_REP + llama-server's fixed project name
TAIL = "<|file_sep|>filename\n"        # FIM_SEP + its fixed name of the edited file
DIGITS = "0123456789" * 10
PLAIN_SPECIALS = ("<pre>", "<suf>", "<mid>")   # texts llama.cpp does not know: ids from metadata only


@contextlib.contextmanager
def engine_on(path, **config):
    threads = torch.get_num_threads()
    bundle = ModelBundle.load(ModelConfig(path, threads=1))
    engine = Engine(bundle, EngineConfig(n_parallel=1, ctx_size=256, batch_size=64, **config)).start()
    try:
        yield bundle, engine
    finally:
        engine.stop()
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def fim(tmp_path_factory):
    """A model with Qwen2.5-Coder's FIM texts (found by text, as llama.cpp does), -b 64, 256 cells."""
    with engine_on(write_tiny_gguf(tmp_path_factory.mktemp("fim") / "fim.gguf", extra_specials=FIM_SPECIALS)) as r:
        yield r


@pytest.fixture(scope="module")
def client(fim):
    with make_client(fim) as c:
        yield c


def plain_ids(tok, prefix: str, suffix: str, prompt: str = "") -> list[int]:
    """The expected ids without input_extra, spelled out independently of infill_prompt.py."""
    enc = lambda text: tok.encode(text, add_special=False)   # noqa: E731
    return [tok.token_to_id("<|repo_name|>"), *enc("myproject\n"), tok.token_to_id("<|file_sep|>"), *enc("filename\n"),
            tok.token_to_id("<|fim_prefix|>"), *enc(prefix), *enc(prompt), tok.token_to_id("<|fim_suffix|>"),
            *enc(suffix), tok.token_to_id("<|fim_middle|>")]


def infill(client, **body) -> dict:
    r = client.post("/infill", json={"n_predict": 4, "temperature": 0, "return_tokens": True, **body})
    assert r.status_code == 200, r.text
    return r.json()


def completion(client, prompt: list[int], **body) -> dict:
    r = client.post("/completion", json={"prompt": prompt, "n_predict": 4, "temperature": 0,
                                         "return_tokens": True, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_repo_level_layout_with_extra_files_prefix_prompt_suffix_middle(client, fim):
    tok = fim[0].tokenizer
    enc = lambda text: tok.encode(text, add_special=False)   # noqa: E731
    r = infill(client, input_prefix="def f(x):\n", prompt="    x", input_suffix="\nf(2)\n",
               input_extra=[{"filename": "a.py", "text": "A = 1\n"}, {"text": "B = 2\n"}])
    assert r["prompt"] == (HEAD + "<|file_sep|>a.py\nA = 1\n<|file_sep|>tmp\nB = 2\n" + TAIL +
                           "<|fim_prefix|>def f(x):\n    x<|fim_suffix|>\nf(2)\n<|fim_middle|>")
    sep = tok.token_to_id("<|file_sep|>")
    extra = [sep, *enc("a.py\n"), *enc("A = 1\n"), sep, *enc("tmp\n"), *enc("B = 2\n")]
    ids = plain_ids(tok, "def f(x):\n", "\nf(2)\n", "    x")
    n_head = 1 + len(enc("myproject\n"))
    ids = ids[:n_head] + extra + ids[n_head:]
    assert r["tokens_evaluated"] == len(ids)
    assert r["tokens"] == completion(client, ids)["tokens"] and len(r["tokens"]) == 4   # /completion on those ids


def test_prefix_keeps_its_last_48_tokens_and_suffix_its_first_14_minus_the_prompt(client, fim):
    assert len(fim[0].tokenizer.encode(DIGITS + "xyz", add_special=False)) == 103   # one token per character
    r = infill(client, input_prefix=DIGITS, input_suffix=DIGITS[::-1], prompt="xyz")
    assert r["prompt"] == f"{HEAD}{TAIL}<|fim_prefix|>{DIGITS[-48:]}xyz<|fim_suffix|>{DIGITS[::-1][:11]}<|fim_middle|>"
    long_prompt = infill(client, input_prefix="1", input_suffix="2", prompt="9" * 14)
    assert long_prompt["prompt"] == f"{HEAD}{TAIL}<|fim_prefix|>1{'9' * 14}<|fim_suffix|><|fim_middle|>"


def test_extra_context_keeps_its_last_n_ctx_minus_batch_minus_twice_n_predict_tokens(fim):
    tok = fim[0].tokenizer
    with make_client(fim, defaults=GenerationDefaults(n_predict=64)) as c:   # 256 - 64 - 2*64 = 64 tokens
        r = infill(c, input_prefix="p", input_suffix="s", input_extra=[{"filename": "f.py", "text": DIGITS}])
    kept_digits = 64 - 1 - len(tok.encode("filename\n"))
    assert r["prompt"] == f"{DIGITS[-kept_digits:]}{TAIL}<|fim_prefix|>p<|fim_suffix|>s<|fim_middle|>"


def test_spm_infill_puts_the_suffix_part_first(fim):
    with make_client(fim, spm_infill=True) as c:
        r = infill(c, input_prefix="a=", prompt="1", input_suffix="\nb=2")
    assert r["prompt"] == f"{HEAD}{TAIL}<|fim_suffix|>\nb=2<|fim_prefix|>a=1<|fim_middle|>"


def test_mixed_prefix_ids_stay_and_special_text_is_text_except_in_prompt(client, fim):
    tok = fim[0].tokenizer
    eight = tok.encode("8")[0]
    r = infill(client, input_prefix=["7", eight, "<|fim_suffix|>"], input_suffix=[eight], prompt="<|fim_pad|>")
    assert r["prompt"] == f"{HEAD}{TAIL}<|fim_prefix|>78<|fim_suffix|><|fim_pad|><|fim_suffix|>8<|fim_middle|>"
    as_text = len(tok.encode("<|fim_suffix|>"))   # the prefix's copy is plain text: many tokens
    assert as_text > 1 and r["tokens_evaluated"] == len(plain_ids(tok, "78", "8")) + as_text + 1


def test_bos_after_the_extra_context_and_snippets_without_file_separators(tmp_path):
    """Metadata FIM ids (texts llama.cpp would not find), add_bos, no FIM_REP/FIM_SEP."""
    tokens = tiny_vocab((), PLAIN_SPECIALS)[0]
    meta = {f"tokenizer.ggml.fim_{k}_token_id": (tokens.index(t), gguf.GGUFValueType.UINT32)
            for k, t in zip(("pre", "suf", "mid"), PLAIN_SPECIALS)}
    path = write_tiny_gguf(tmp_path / "bos.gguf", extra_specials=PLAIN_SPECIALS,
                           **meta, **{"tokenizer.ggml.add_bos_token": True})
    with engine_on(path) as running, make_client(running) as c:
        r = infill(c, input_prefix="a", input_suffix="b", prompt="c", input_extra=[{"text": "x"}, {"text": "y"}])
    snippet = "\n\n--- snippet ---\n\n"
    assert r["prompt"] == f"{snippet}x{snippet}y<|endoftext|><pre>ac<suf>b<mid>"


def test_a_model_without_fim_tokens_gets_llama_servers_501(tmp_path):
    with engine_on(write_tiny_gguf(tmp_path / "plain.gguf")) as running, make_client(running) as c:
        err = assert_error(c.post("/infill", json={"input_prefix": "a", "input_suffix": "b"}), 501)
    assert err["message"] == ("Infill is not supported by this model: prefix token is missing. "
                              "suffix token is missing. middle token is missing. ")


@pytest.mark.parametrize("body, message", [
    ({"input_extra": [{}]}, 'extra_context chunk must contain a "text" field with a string value'),
    ({"input_extra": [{"filename": "ok"}]}, 'extra_context chunk must contain a "text" field'),
    ({"input_extra": [{"filename": 123, "text": "abc"}]}, 'extra_context chunk\'s "filename" field must be a string'),
    ({"input_extra": [{"filename": "a", "text": 456}]}, 'must contain a "text" field with a string value'),
    ({"input_extra": {"text": "a"}}, '"input_extra" must be an array'),
    ({"input_prefix": None}, '"input_prefix" is required'),
    ({"input_suffix": None}, '"input_suffix" is required'),
    ({"input_prefix": 5}, '"input_prefix" must be a string or an array of strings and token ids'),
    ({"input_suffix": [10**6]}, '"input_suffix" must hold token ids in [0, 316)'),
    ({"prompt": ["a"]}, '"prompt" must be a string'),
    ({"temperature": "hot"}, "'temperature' must be a number"),   # /completion's own fields, its checks
    ({"n_indent": -1}, "'n_indent' must be in [0, "),
    ({"t_max_predict_ms": -2}, "'t_max_predict_ms' must be in [-1, "),
    ({"sse_ping_interval": -2}, "'sse_ping_interval' must be in [-1, "),
])
def test_bad_fields_are_400_naming_them(client, body, message):
    full = {"input_prefix": "a", "input_suffix": "b", **body}
    assert message in assert_error(client.post("/infill", json={k: v for k, v in full.items() if v is not None}),
                                   400)["message"]


def test_streaming_sends_the_greedy_tokens_then_a_summary(client):
    body = {"input_prefix": "def g(", "input_suffix": "):\n", "n_predict": 6}
    whole = infill(client, **body)
    chunks = [json.loads(e) for e in sse_events(client.post("/infill", json={
        **body, "temperature": 0, "stream": True, "return_tokens": True}).text)]
    assert "".join(c["content"] for c in chunks) == whole["content"]
    assert [t for c in chunks for t in c["tokens"]] == whole["tokens"]
    assert chunks[-1]["stop"] is True and chunks[-1]["prompt"] == whole["prompt"]


def test_seeded_sampling_repeats_and_is_completions_on_the_same_prompt(client, fim):
    body = {"input_prefix": "x = ", "input_suffix": "\n", "n_predict": 8, "temperature": 1.5, "seed": 7,
            "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    first, again = infill(client, **body), infill(client, **body)
    assert first["tokens"] == again["tokens"] and len(first["tokens"]) == 8
    other_seed = infill(client, **{**body, "seed": 8})
    assert other_seed["tokens"] != first["tokens"]
    sampling = {k: v for k, v in body.items() if not k.startswith("input_")}
    ids = plain_ids(fim[0].tokenizer, "x = ", "\n")
    assert first["tokens_evaluated"] == len(ids)
    assert completion(client, ids, **sampling)["tokens"] == first["tokens"]


def test_spm_infill_flag_reaches_the_server_config(tmp_path):
    path = str(write_tiny_gguf(tmp_path / "m.gguf"))
    assert server_config_from_args(cli.build_parser().parse_args(["serve", "-m", path, "--spm-infill"])).spm_infill
    assert not server_config_from_args(cli.build_parser().parse_args(["serve", "-m", path])).spm_infill
    with pytest.raises(ConfigError, match="spm_infill"):
        ServerConfig(spm_infill="yes")


# -- llama.vim's requests: n_indent, t_max_predict_ms, the infill sampler ---------------------------

LLAMA_VIM = {   # what llama.vim's llama#fim sends (autoload/llama.vim), the cursor's line indented by 4
    "input_prefix": "def f(x):\n    y = x\n", "input_suffix": "\n    return y\n",
    "input_extra": [{"text": "z = 1\n", "time": 123.4, "filename": "a.py"}], "prompt": "    y",
    "n_predict": 16, "n_indent": 4, "top_k": 40, "top_p": 0.99, "stream": False,
    "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1000,
    "response_fields": ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
                        "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
                        "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached"],
}


def test_llama_vims_request_is_answered_with_the_fields_it_asked_for_and_a_seed_repeats_it(client):
    answers = [client.post("/infill", json={**LLAMA_VIM, "seed": 7}) for _ in range(2)]
    assert [r.status_code for r in answers] == [200, 200], answers[0].text
    body = answers[0].json()
    assert list(body) == LLAMA_VIM["response_fields"]   # "timings/x" keys as llama-server names them
    assert isinstance(body["content"], str) and 1 <= body["timings/predicted_n"] <= 16
    assert answers[1].json()["content"] == body["content"]


# the grammar spells the text out, a character (one token of the tiny vocabulary) a step
SPELLED = {"prompt": "x", "grammar": 'root ::= "1\\n    2\\n3\\n4"', "temperature": 0, "n_predict": 20}


def test_n_indent_ends_the_answer_at_a_line_indented_less_and_cuts_it_there(client):
    assert completion(client, [5], **{k: v for k, v in SPELLED.items() if k != "prompt"})["content"] == "1\n    2\n3\n4"
    body = client.post("/completion", json={**SPELLED, "n_indent": 4}).json()
    # "3" opens a line indented 0 < 4: the generation ends at the token after it (the check trails the
    # text by a line, as llama-server's), the answer is cut where "3" starts
    assert body["content"] == "1\n    2\n" and body["stop_type"] == "limit"
    assert client.post("/completion", json={**SPELLED, "n_indent": 4}).json()["content"] == body["content"]
    chunks = [json.loads(e) for e in sse_events(client.post("/completion", json={**SPELLED, "n_indent": 4, "stream": True}).text)]
    # a stream has been sent each token's text before the check, as llama-server's: "3" arrived
    assert "".join(c["content"] for c in chunks) == "1\n    2\n3" and chunks[-1]["stop_type"] == "limit"
    assert client.post("/completion", json={**SPELLED, "n_indent": 0}).json()["content"] == "1\n    2\n3\n4"


def test_t_max_predict_ms_ends_the_answer_at_a_line_break_once_the_time_is_spent(client):
    spelled = {**SPELLED, "grammar": 'root ::= "1\\n2\\n3\\n4\\n5\\n6\\n7\\n8\\n"'}
    assert client.post("/completion", json=spelled).json()["content"] == "1\n2\n3\n4\n5\n6\n7\n8\n"
    body = client.post("/completion", json={**spelled, "t_max_predict_ms": 1}).json()
    # 16 steps take more than a millisecond: a line break once it has passed ends the answer there
    full = "1\n2\n3\n4\n5\n6\n7\n8\n"
    assert body["stop_type"] == "limit" and body["content"].endswith("\n") and len(body["content"]) < len(full)
    assert full.startswith(body["content"])
    assert client.post("/completion", json={**spelled, "t_max_predict_ms": 60_000}).json()["content"] == "1\n2\n3\n4\n5\n6\n7\n8\n"
