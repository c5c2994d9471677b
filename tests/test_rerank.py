"""Reranking (/rerank, /reranking, /v1/rerank, /v1/reranking) on the tiny BERT fixture's classification head:
prompts built as llama-server builds them, scores against the independent reference (tests/bert_reference.py)
and llama-server's recorded scores (tests/fixtures/bert/tiny-bert.json), ordering, top_n, both request
forms (Jina's `documents`, TEI's `texts`), and the 400s.
"""

from __future__ import annotations

import json

import pytest

from bert_reference import rank_scores, read_gguf, wpm_tokenize
from embed_server import TINY_BERT, embedding_client
from slotserver.model.text.tokenizer import Tokenizer
from slotserver.server.routes.rerank import rerank_tokens

RECORDED = json.loads(TINY_BERT.with_suffix(".json").read_text())
QUERY, DOCS = RECORDED["query"], RECORDED["documents"]
MD = read_gguf(TINY_BERT)[0]
CLS, SEP = 2, 3


@pytest.fixture(scope="module")
def client():
    with embedding_client(rerank=True) as c:
        yield c


def pair(query: str, doc: str) -> list[int]:
    """[CLS] query [SEP] doc [SEP]: the file asks for bos and eos (= [SEP]) and no separate sep."""
    return [CLS, *wpm_tokenize(MD, query, False), SEP, *wpm_tokenize(MD, doc, False), SEP]


def reference_scores() -> list[float]:
    return [float(rank_scores(TINY_BERT, pair(QUERY, d))[0]) for d in DOCS]


def test_prompts_are_llama_servers_and_a_rerank_template_replaces_them():
    tok = Tokenizer.from_metadata(MD)
    assert rerank_tokens(tok, QUERY, DOCS[0], None) == pair(QUERY, DOCS[0])
    templated = rerank_tokens(tok, "x", "hello", "[CLS]{query}[SEP]{document}")   # special text parsed
    assert templated == [CLS, *wpm_tokenize(MD, "x", False), SEP, *wpm_tokenize(MD, "hello", False)]


@pytest.mark.parametrize("path", ["/rerank", "/reranking", "/v1/rerank", "/v1/reranking"])
def test_scores_are_the_heads_first_output_best_first_with_usage(client, path):
    r = client.post(path, json={"query": QUERY, "documents": DOCS, "model": "rr"})
    assert r.status_code == 200, r.text
    body = r.json()
    want = reference_scores()
    assert [x["index"] for x in body["results"]] == sorted(range(len(DOCS)), key=lambda i: -want[i])
    for x in body["results"]:
        assert x["relevance_score"] == pytest.approx(want[x["index"]], abs=1e-4)
        assert set(x) == {"index", "relevance_score"}
    n = sum(len(pair(QUERY, d)) for d in DOCS)
    assert body["usage"] == {"prompt_tokens": n, "total_tokens": n} and body["model"] == "rr"
    assert body["object"] == "list"


def test_scores_match_llama_servers(client):
    body = client.post("/rerank", json={"query": QUERY, "documents": DOCS}).json()
    got = {x["index"]: x["relevance_score"] for x in body["results"]}
    assert [got[i] for i in range(len(DOCS))] == pytest.approx(RECORDED["rerank"]["scores"], abs=1e-4)
    assert body["usage"]["prompt_tokens"] == RECORDED["rerank"]["prompt_tokens"]


@pytest.mark.parametrize("top_n, n", [(None, 4), (0, 0), (2, 2), (99, 4)])
def test_top_n_keeps_the_best(client, top_n, n):
    full = client.post("/rerank", json={"query": QUERY, "documents": DOCS}).json()["results"]
    body = {"query": QUERY, "documents": DOCS, **({} if top_n is None else {"top_n": top_n})}
    assert client.post("/rerank", json=body).json()["results"] == full[:n]


def test_documents_come_back_on_request_in_each_form(client):
    jina = client.post("/rerank", json={"query": QUERY, "documents": DOCS, "return_documents": True}).json()
    assert all(x["document"] == {"text": DOCS[x["index"]]} for x in jina["results"])
    tei = client.post("/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True, "top_n": 3}).json()
    assert isinstance(tei, list) and len(tei) == 3
    assert all(set(x) == {"index", "score", "text"} and x["text"] == DOCS[x["index"]] for x in tei)
    assert [x["index"] for x in tei] == [x["index"] for x in jina["results"][:3]]


@pytest.mark.parametrize("body, words", [
    ({"query": QUERY, "documents": []}, '"documents" must be a non-empty string array'),
    ({"query": QUERY, "documents": None}, '"documents" must be a non-empty string array'),
    ({"query": QUERY, "documents": 123}, '"documents" must be a non-empty string array'),
    ({"query": QUERY, "documents": [1, 2, 3]}, '"documents" must be a non-empty string array'),
    ({"documents": DOCS}, '"query" must be provided'),
    ({"query": 5, "documents": DOCS}, '"query" must be a string'),
    ({"query": QUERY, "documents": DOCS, "texts": DOCS}, "not both"),
    ({"query": QUERY, "documents": DOCS, "top_n": -1}, "'top_n' must be in [0,"),
    ({"query": QUERY, "documents": DOCS, "return_text": True}, "'return_text' belongs to the TEI form"),
    ({"query": QUERY, "texts": DOCS, "raw_scores": False}, "'raw_scores' false"),
    ({"query": QUERY, "texts": DOCS, "truncate": True}, "'truncate' is not supported"),
    ({"query": QUERY, "documents": DOCS, "rank_fields": ["a"]}, "unknown field 'rank_fields'"),
])
def test_bad_requests_are_400s_that_name_the_problem(client, body, words):
    r = client.post("/rerank", json=body)
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"]


def test_a_pair_too_long_is_refused_and_a_server_without_reranking_says_how_to_get_it():
    with embedding_client(rerank=True, ubatch=10) as c:
        r = c.post("/rerank", json={"query": QUERY, "documents": ["x", "the " * 8]})
        assert r.status_code == 400 and "too large to process" in r.json()["error"]["message"]
    with embedding_client() as c:
        r = c.post("/rerank", json={"query": QUERY, "documents": DOCS})
        assert r.status_code == 501 and "Start it with `--reranking`" in r.json()["error"]["message"]
