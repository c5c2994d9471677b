"""llama-server's sampling flags (`--top-k`, `--min-p`, `-l`, `--ignore-eos`, `-j`...) as the
defaults of every request that does not set the field, through the server's HTTP app; bad values
stop the server with one line.
"""

from __future__ import annotations

import pytest
from test_server_api import greedy, make_client
from test_server_cli import parse, run_cli
from tiny_engine import running_tiny_engine

from slotserver.server.config import GenerationDefaults
from slotserver.server.config_from_args import server_config_from_args

SEEDS = range(1, 9)


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    with running_tiny_engine(tmp_path_factory.mktemp("tiny"), 2, 256) as running:
        yield running


def client_with(tiny_engine, **fields):
    return make_client(tiny_engine, defaults=GenerationDefaults(fields=fields))


def sampled(c, seed: int, **extra) -> list[int]:
    body = {"prompt": "Once upon", "n_predict": 6, "temperature": 1.5, "seed": seed, "return_tokens": True, **extra}
    r = c.post("/completion", json=body)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_flags_become_request_fields_by_their_request_names(tmp_path):
    grammar = tmp_path / "g.gbnf"
    grammar.write_text('root ::= "yes" | "no"')
    args = parse("--top-k", "20", "--top-p", "0.8", "--min-p", "0", "--repeat-penalty", "1.05", "--typical", "0.9",
                 "--dry-sequence-breaker", "x", "--dry-sequence-breaker", "none", "--dry-sequence-breaker", "\n",
                 "-l", "15+2.5", "-l", "7-inf", "--ignore-eos", "--sampler-seq", "kt", "--keep", "-1",
                 "--mirostat-ent", "3", "--grammar-file", str(grammar), "-s", "5", "--temperature", "0.7")
    d = server_config_from_args(args).defaults
    assert d.fields == {"top_k": 20, "top_p": 0.8, "min_p": 0.0, "repeat_penalty": 1.05, "typical_p": 0.9,
                        "dry_sequence_breakers": ["\n"], "logit_bias": [[15, 2.5], [7, False]], "ignore_eos": True,
                        "samplers": "kt", "n_keep": -1, "mirostat_tau": 3.0, "grammar": 'root ::= "yes" | "no"'}
    assert (d.seed, d.temperature) == (5, 0.7)
    assert server_config_from_args(parse()).defaults.fields == {}


@pytest.mark.parametrize("argv, named", [
    (("--top-p", "2"), "--top-p"), (("--mirostat", "3"), "--mirostat"), (("--top-k", "x"), "--top-k"),
    (("--samplers", "top_k;bogus"), "--samplers"), (("-l", "15"), "--logit-bias"), (("-l", "15+1e9"), "--logit-bias"),
    (("-jf", "/no/such.json"), "--json-schema-file"), (("-j", "[1"), "--json-schema"),
    (("--grammar", "root ::= \"a\"", "-j", "{}"), "--json-schema"), (("--grammar", "root ::= ((("), "--grammar"),
    (("-j", '{"type": "nonsense"}'), "--json-schema")])
def test_a_bad_value_is_one_line_naming_the_flag(capsys, argv, named):
    status, err = run_cli(capsys, *argv)
    assert status == 2 and len(err) == 1 and named in err[0], err


def test_top_k_1_from_the_flag_samples_greedily_until_a_request_says_otherwise(tiny_engine):
    with make_client(tiny_engine) as c:
        want = greedy(c, "Once upon", n=6)["tokens"]
        free = {tuple(sampled(c, s)) for s in SEEDS}
    assert len(free) > 1, "the tiny model's draws at temperature 1.5 should differ between seeds"
    with client_with(tiny_engine, top_k=1) as c:
        assert all(sampled(c, s) == want for s in SEEDS)
        # the request's own top_k wins (40: the default)
        assert {tuple(sampled(c, s, top_k=40)) for s in SEEDS} == free


def test_logit_bias_and_ignore_eos_flags_apply_to_chat_too(tiny_engine):
    with make_client(tiny_engine) as c:
        first = greedy(c, "Once upon", n=1)["tokens"][0]
    with client_with(tiny_engine, logit_bias=[[first, False]], ignore_eos=True) as c:
        assert greedy(c, "Once upon", n=1)["tokens"][0] != first
        assert greedy(c, "Once upon", n=1, logit_bias=[])["tokens"][0] == first   # replaced, not merged
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 12,
                                                 "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 12   # no EOS stops it
    with client_with(tiny_engine, logit_bias=[[10**6, 1.0]]) as c:   # past the vocabulary: skipped, as llama-server
        assert greedy(c, "Once upon", n=1)["tokens"][0] == first


def test_the_servers_json_schema_constrains_requests_without_their_own(tiny_engine):
    with client_with(tiny_engine, json_schema={"type": "boolean"}) as c:
        for seed in SEEDS:
            r = c.post("/completion", json={"prompt": "x", "n_predict": 8, "seed": seed, "temperature": 1.5})
            assert r.status_code == 200 and r.json()["content"] in ("true", "false"), r.text
        r = c.post("/completion", json={"prompt": "x", "n_predict": 4, "temperature": 0,
                                        "json_schema": {"type": "integer", "minimum": 0}})
        assert r.status_code == 200 and r.json()["content"].isdigit(), r.text
