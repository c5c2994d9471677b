"""Embeddings: the WordPiece tokenizer, the BERT encoder and its pooling against independent references
(tests/bert_reference.py) and llama-server's recorded answers (tests/fixtures/bert/tiny-bert.json,
made by playground/make_bert_fixture.py), a decoder model's pooled hidden states, and what a client
of /embedding, /embeddings and /v1/embeddings sees (the OpenAI SDK included).
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading

import numpy as np
import pytest
import torch

from bert_reference import bert_hidden, read_gguf, wpm_tokenize
from embed_server import TINY_BERT, embedding_client, load_worker
from slotserver.model.encoder.pooling import normalize
from slotserver.model.text.tokenizer import Tokenizer
from slotserver.model.text.wordpiece import WordPieceTokenizer

RECORDED = json.loads(TINY_BERT.with_suffix(".json").read_text())
TEXTS = RECORDED["texts"]
MD = read_gguf(TINY_BERT)[0]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_metadata(MD)


@pytest.fixture(scope="module")
def client():
    with embedding_client() as c:   # the model's own pooling: mean
        yield c


def ref_pooled(text: str, pooling: str = "mean") -> torch.Tensor:
    """The reference's pooled vector of `text` (before normalization)."""
    h = bert_hidden(TINY_BERT, wpm_tokenize(MD, text))
    return {"mean": h.mean(0), "cls": h[0], "last": h[-1]}[pooling]


def unit(v: torch.Tensor) -> torch.Tensor:
    return v / v.norm()


# -- tokenizer ------------------------------------------------------------------------------------

def test_wordpiece_is_llama_cpps_wpm_on_tricky_texts(tok):
    assert isinstance(tok, WordPieceTokenizer)
    extra = ["UNAFFABLE!!", "a.b,c", "  leading and trailing  ", "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz" * 3,
             "naïve\u0301 mixed Ü", "\x00control\x07chars", "emoji 🙂 ok", "ab中cd"]
    for text in TEXTS + extra:
        assert tok.encode(text, add_special=True) == wpm_tokenize(MD, text), text


def test_wordpiece_matches_llama_servers_tokenize(tok):
    """/tokenize with add_special (special-token text parsed, as llama-server's default)."""
    assert [tok.encode(t, True, True) for t in TEXTS] == RECORDED["tokenize"]


def test_special_token_text_is_a_token_only_with_parse_special(tok):
    cls, sep = tok.bos_id, tok.sep_id
    assert (cls, sep, tok.unk_id) == (2, 3, 1)   # the fixture's ids, not BERT's usual 101/102/100
    assert tok.encode("[SEP]", add_special=False, parse_special=True) == [sep]
    assert tok.encode("[SEP]", add_special=False, parse_special=False) == wpm_tokenize(MD, "[SEP]", False)
    assert tok.decode(tok.encode("hello world", True)) == " hello world"
    assert tok.decode(tok.encode("hello world", True), special=True) == "[CLS] hello world[SEP]"


# -- encoder and pooling --------------------------------------------------------------------------

@pytest.mark.parametrize("table, tol", [(False, 1e-5), (True, 1e-3)])
def test_bert_hidden_states_match_the_reference(table, tol):
    """With ggml's f16 GELU table off, the reference's tanh GELU; with it on, the reference's table
    (a float64 reference crosses f16 rounding boundaries where float32 does not: hence 1e-3)."""
    import bert_reference

    worker = load_worker("none")
    worker.embedder.encoder.gelu_table = table
    seqs = [wpm_tokenize(MD, t) for t in TEXTS]
    gelu = bert_reference.ggml_gelu
    try:
        if not table:
            bert_reference.ggml_gelu = lambda x: torch.nn.functional.gelu(x, approximate="tanh")
        for seq, got in zip(seqs, worker.embedder.run(seqs)):
            assert got.shape == (len(seq), 32)
            torch.testing.assert_close(got.double(), bert_hidden(TINY_BERT, seq), atol=tol, rtol=0)
    finally:
        bert_reference.ggml_gelu = gelu


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_pooled_vectors_match_the_reference_and_do_not_depend_on_the_batch(pooling):
    worker = load_worker(pooling)
    seqs = [wpm_tokenize(MD, t) for t in TEXTS]
    batched = worker.embedder.run(seqs)
    for text, seq, got in zip(TEXTS, seqs, batched):
        assert got.shape == (1, 32)
        torch.testing.assert_close(got[0].double(), ref_pooled(text, pooling), atol=1e-3, rtol=0)
        alone = worker.embedder.run([seq])[0]          # unpadded, vs padded among the others
        torch.testing.assert_close(alone, got, atol=1e-5, rtol=0)   # matmul blocking only


@pytest.mark.parametrize("pooling", ["mean", "cls", "last", "none"])
def test_vectors_match_llama_servers(pooling):
    """The recorded /embeddings answers of llama-server on the same file: normalized pooled vectors,
    raw per-token ones for none."""
    worker = load_worker(pooling)
    got = worker.embedder.run([worker.embedder.tokenizer.encode(t, True, True) for t in TEXTS])
    for text, vec, want in zip(TEXTS, got, RECORDED["embeddings"][pooling]):
        ours = vec.double() if pooling == "none" else torch.tensor([normalize(vec[0])]).double()
        assert ours.shape == (len(want), 32), text
        # raw token vectors: one GELU input on the other side of an f16 rounding boundary moves a few
        # by up to ~2e-4; the pooled, normalized vectors agree to float32 rounding
        tol = 5e-4 if pooling == "none" else 2e-5
        torch.testing.assert_close(ours, torch.tensor(want).double(), atol=tol, rtol=0)


def test_normalizations_are_llama_servers_embd_normalize():
    v = torch.tensor([3.0, -4.0, 0.0])
    assert normalize(v, 2) == pytest.approx([0.6, -0.8, 0.0])
    assert normalize(v, 1) == pytest.approx([3 / 7, -4 / 7, 0.0])
    assert normalize(v, 0) == pytest.approx([3 * 32760 / 4, -32760.0, 0.0])
    assert normalize(v, -1) == [3.0, -4.0, 0.0]
    assert normalize(v, 3) == pytest.approx((v / (27 + 64) ** (1 / 3)).tolist())
    assert normalize(torch.zeros(3), 2) == [0.0, 0.0, 0.0]


def test_a_decoder_models_pooled_states_are_its_final_normed_hidden_states(tmp_path):
    """Pooling over a llama model: each token's vector times the output matrix gives the independent
    reference forward's logits, so the vectors are llama.cpp's result_norm."""
    from llama_reference import read_gguf as _tensors, llama_logits
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "tiny-llama.gguf", seed=3)
    worker = load_worker("none", path=path)
    seqs = [[1, 5, 9, 2, 7], [4, 4], [8, 3, 6, 1, 2, 2, 9]]
    out_w = _tensors(path)[1].get("output.weight", _tensors(path)[1]["token_embd.weight"])
    for seq, hidden in zip(seqs, worker.embedder.run(seqs)):
        torch.testing.assert_close(hidden.double() @ out_w.T, llama_logits(path, seq), atol=2e-4, rtol=1e-4)
    last = load_worker("last", path=path).embedder.run(seqs)
    torch.testing.assert_close(last[2][0], worker.embedder.run([seqs[2]])[0][-1], atol=1e-5, rtol=0)


# -- HTTP -----------------------------------------------------------------------------------------

def test_the_openai_sdk_gets_normalized_vectors_usage_and_the_model(client):
    from openai import OpenAI

    sdk = OpenAI(base_url="http://testserver/v1", api_key="none", http_client=client)
    res = sdk.embeddings.create(model="my-embedder", input=["hello world", "x"])   # the SDK asks base64
    assert [d.index for d in res.data] == [0, 1] and res.model == "my-embedder"
    assert res.usage.prompt_tokens == res.usage.total_tokens == 4 + 3
    for d, text in zip(res.data, ["hello world", "x"]):
        assert np.allclose(d.embedding, unit(ref_pooled(text)).numpy(), atol=2e-4)
    single = sdk.embeddings.create(model="m", input="hello world", encoding_format="float")
    assert np.allclose(single.data[0].embedding, res.data[0].embedding, atol=1e-7)


def test_base64_is_the_float_vectors_bytes(client):
    f = client.post("/v1/embeddings", json={"input": "hello world"}).json()["data"][0]
    b = client.post("/v1/embeddings", json={"input": "hello world", "encoding_format": "base64"}).json()["data"][0]
    assert b["encoding_format"] == "base64" and "encoding_format" not in f and f["object"] == "embedding"
    assert np.frombuffer(base64.b64decode(b["embedding"]), "<f4").tolist() == pytest.approx(f["embedding"], abs=0)


@pytest.mark.parametrize("form", [
    [2, 8, 9, 3],                                             # the text's own tokens, [CLS]/[SEP] included
    {"prompt_string": "hello world"},
    {"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]},
    ["hello", 9, 3],                                          # mixed: the first string gets [CLS] .. [SEP]
])
def test_every_input_shape_of_llama_server_gives_the_texts_vector(client, form):
    want = client.post("/v1/embeddings", json={"input": "hello world"}).json()["data"][0]["embedding"]
    if form == ["hello", 9, 3]:   # "hello" alone is [CLS] hello [SEP]: then world, [SEP]
        want = unit(bert_hidden(TINY_BERT, [2, 8, 3, 9, 3]).mean(0)).tolist()
    got = client.post("/v1/embeddings", json={"input": form}).json()
    assert len(got["data"]) == 1
    assert got["data"][0]["embedding"] == pytest.approx(want, abs=2e-4)


def test_a_list_of_inputs_keeps_its_order_and_counts_tokens(client):
    body = {"input": ["x", [2, 8, 9, 3], {"prompt_string": "hello world"}, "the the the the the the"]}
    r = client.post("/v1/embeddings", json=body).json()
    vecs = [d["embedding"] for d in r["data"]]
    assert [d["index"] for d in r["data"]] == [0, 1, 2, 3] and r["usage"]["prompt_tokens"] == 3 + 4 + 4 + 8
    assert vecs[1] == pytest.approx(vecs[2], abs=1e-6)
    assert vecs[0] == pytest.approx(unit(ref_pooled("x")).tolist(), abs=2e-4)


def test_llama_format_routes_and_the_content_field(client):
    want = client.post("/v1/embeddings", json={"input": "hello world"}).json()["data"][0]["embedding"]
    for path in ("/embedding", "/embeddings"):
        [row] = client.post(path, json={"content": "hello world"}).json()
        assert row["index"] == 0 and row["embedding"][0] == pytest.approx(want, abs=1e-7)
    # `content` on the OpenAI route gets the llama form, as llama-server answers it
    assert isinstance(client.post("/v1/embeddings", json={"content": "hello world"}).json(), list)


def test_embd_normalize_minus_one_gives_the_raw_mean(client):
    r = client.post("/v1/embeddings", json={"input": "hello world", "embd_normalize": -1}).json()
    assert r["data"][0]["embedding"] == pytest.approx(ref_pooled("hello world").tolist(), abs=1e-3)
    taxicab = client.post("/v1/embeddings", json={"input": "hello world", "embd_normalize": 1}).json()
    assert sum(abs(x) for x in taxicab["data"][0]["embedding"]) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("body, words", [
    ({"input": "x", "pooling": "cls"}, "unknown field 'pooling'"),
    ({"input": []}, "'input' must not be empty"),
    ({"input": [[]]}, "Input content cannot be empty"),
    ({"model": "m"}, '"input" or "content" must be provided'),
    ({"input": "x", "encoding_format": "hex"}, "either float or base64"),
    ({"input": "x", "dimensions": 16}, "'dimensions' must be 32"),
    ({"input": [2, 999]}, "token ids in [0,"),
    ({"input": {"content": "text"}}, "must be an array of content parts"),
    ({"input": {"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}},
     "image_url input is not supported"),
    ({"input": {"content": [{"type": "unknown"}]}}, "unsupported content[].type"),
    ({"input": "x", "embd_normalize": -2}, "'embd_normalize' must be in [-1,"),
])
def test_bad_requests_are_400s_that_name_the_problem(client, body, words):
    r = client.post("/v1/embeddings", json=body)
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"] and r.json()["error"]["type"] == "invalid_request_error"


def test_an_input_longer_than_the_server_takes_is_refused_with_llama_servers_words():
    with embedding_client(ubatch=8) as c:
        r = c.post("/v1/embeddings", json={"input": ["x", "the " * 7]})
        assert r.status_code == 400 and "input (9 tokens) is too large to process" in r.json()["error"]["message"]
        assert c.post("/v1/embeddings", json={"input": "the " * 6}).status_code == 200


def test_pooling_none_gives_unnormalized_token_vectors_on_the_llama_route_only():
    with embedding_client(pooling="none") as c:
        [row] = c.post("/embeddings", json={"input": "hello hello hello"}).json()
        assert len(row["embedding"]) == 5   # [CLS] + 3 + [SEP]
        want = bert_hidden(TINY_BERT, [2, 8, 8, 8, 3])
        assert np.allclose(row["embedding"], want.numpy(), atol=1e-3)
        r = c.post("/v1/embeddings", json={"input": "hello"})
        assert r.status_code == 400 and "Pooling type 'none' is not OAI compatible" in r.json()["error"]["message"]


def test_an_embedding_server_answers_completions_501_and_a_generation_server_embeddings_501(client):
    r = client.post("/completion", json={"prompt": "hi"})
    assert r.status_code == 501 and "embedding-only" in r.json()["error"]["message"]
    assert client.post("/v1/chat/completions", json={"messages": []}).status_code == 501
    assert client.get("/health").json() == {"status": "ok"}
    from starlette.testclient import TestClient

    from slotserver.server import ServerConfig, ServerState, create_app
    state = ServerState(ServerConfig())
    state.engine = object()   # a generation server (ready, no embedder): the route refuses before using it
    with TestClient(create_app(state)) as gen:
        r = gen.post("/v1/embeddings", json={"input": "x"})
        assert r.status_code == 501 and "Start it with `--embeddings`" in r.json()["error"]["message"]
        assert "--reranking" in gen.post("/rerank", json={"query": "q", "documents": ["d"]}).json()["error"]["message"]


def test_requests_waiting_together_run_in_one_forward():
    """Jobs queued before the worker looks are computed in one `Embedder.run` call."""
    worker = load_worker()
    calls = []
    run = worker.embedder.run
    worker.embedder.run = lambda seqs: calls.append(len(seqs)) or run(seqs)

    async def main():
        jobs = [asyncio.ensure_future(worker.embed([[2, 8, 3]] * n)) for n in (1, 2, 3)]
        await asyncio.sleep(0)             # all three queued, the worker not started yet
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        results = await asyncio.gather(*jobs)
        worker.stop()
        thread.join(5)
        return results

    results = asyncio.run(main())
    assert calls == [6] and [len(r) for r in results] == [1, 2, 3]



def test_bfloat16_projections_stay_close_to_float32():
    """`serve --dtype bfloat16`: the projections in bf16 (AMX where there is one), the rest in f32."""
    from slotserver.model.config import ModelConfig
    from slotserver.model.encoder.embedder import Embedder

    f32 = load_worker().embedder
    bf16 = Embedder.load(ModelConfig(TINY_BERT, dtype="bfloat16", threads=1))
    assert bf16.encoder.layers[0].qkv.dtype == torch.bfloat16 and f32.encoder.layers[0].qkv.dtype == torch.float32
    seqs = [wpm_tokenize(MD, t) for t in TEXTS]
    for a, b in zip(f32.run(seqs), bf16.run(seqs)):
        cos = torch.nn.functional.cosine_similarity(a[0], b[0], dim=0)
        assert 0.999 < cos < 1 - 1e-7   # close, and not the f32 numbers (the bf16 path did run)


def test_an_embedding_server_tokenizes_and_describes_itself(client, tok):
    """The routes that need only a tokenizer or the server's description answer on an embedding
    server too (llama-server serves /tokenize there): WordPiece ids, the model, its size."""
    ids = client.post("/tokenize", json={"content": "hello world", "add_special": True}).json()["tokens"]
    assert ids == tok.encode("hello world", True, True)
    assert client.post("/detokenize", json={"tokens": ids[1:-1]}).json()["content"].strip() == "hello world"
    props = client.get("/props").json()
    vec = client.post("/v1/embeddings", json={"input": "x"}).json()["data"][0]["embedding"]
    assert props["embedding"] is True and props["n_embd"] == len(vec) and props["is_sleeping"] is False
    models = client.get("/v1/models").json()
    assert models["data"][0]["meta"]["n_embd"] == len(vec) and models["models"][0]["capabilities"] == ["embedding"]
