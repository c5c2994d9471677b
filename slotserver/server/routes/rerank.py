"""POST /rerank, /reranking, /v1/rerank, /v1/reranking: llama-server's reranking, on a --reranking server.

Request (Jina/Cohere form): `query` (a string), `documents` (a non-empty list of strings), `top_n`
(default: all), `return_documents` (ours, Jina's: each result carries `{"document": {"text"}}`),
`model` (echoed). TEI form: `texts` instead of `documents`, `return_text` (each result carries
`text`), TEI's `raw_scores` (true only: the scores are the classifier's raw outputs, as
llama-server's) and `truncate` (false only: a too-long pair is refused). Other fields: 400.

Each document is scored alone with the prompt llama-server builds (`format_prompt_rerank`): the
model's `tokenizer.chat_template.rerank` with `{query}` and `{document}` filled in, else
`[BOS] query [EOS] [SEP] document [EOS]` with each special token where the vocabulary asks for it
(add_bos / add_eos / add_sep; [EOS] falls back to [SEP]): for BERT files from llama.cpp's converter,
`[CLS] query [SEP] document [SEP]`. The score is the classification head's first output.

Answer: Jina form `{"model", "object": "list", "usage", "results": [{"index", "relevance_score"}]}`,
TEI form a list of `{"index", "score"}`; both sorted by score, best first, cut to `top_n`.
"""

from __future__ import annotations

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from slotserver.model.text.tokenizer import Tokenizer
from slotserver.server.body import read_json
from slotserver.server.embed_inputs import check_fields, check_lengths
from slotserver.server.errors import bad_request, not_supported
from slotserver.server.fields import Fields
from slotserver.server.jsonio import JSONResp
from slotserver.server.prompt import encode
from slotserver.server.routes.embeddings import embed_worker
from slotserver.server.state import ServerState

FIELDS = frozenset({"query", "documents", "texts", "top_n", "return_documents", "return_text", "model",
                    "raw_scores", "truncate"})


def rerank_tokens(tok: Tokenizer, query: str, doc: str, template: str | None) -> list[int]:
    """One (query, document) pair's tokens, as llama-server's format_prompt_rerank builds them."""
    if template is not None:
        return encode(tok, template.replace("{query}", query).replace("{document}", doc), False, True)
    sep = getattr(tok, "sep_id", None)
    eos = tok.eos_id if tok.eos_id is not None else sep
    add_eos = tok.add_eos and eos is not None
    add_sep = bool(getattr(tok, "add_sep", False)) and sep is not None
    ids = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
    ids += encode(tok, query, False, False)
    ids += ([eos] if add_eos else []) + ([sep] if add_sep else [])
    ids += encode(tok, doc, False, False)
    return ids + ([eos] if add_eos else [])


def _documents(f: Fields) -> tuple[list[str], bool]:
    """(documents, TEI form?): `documents` or TEI's `texts`, a non-empty list of strings."""
    if f.has("documents") and f.has("texts"):
        raise bad_request("give 'documents' or 'texts' (TEI), not both")
    tei = f.has("texts")
    docs = f.raw("texts" if tei else "documents")
    if not isinstance(docs, list) or not docs or not all(isinstance(d, str) for d in docs):
        raise bad_request('"documents" must be a non-empty string array')
    return docs, tei


def _check_form_fields(f: Fields, tei: bool) -> bool:
    """-> whether the documents' texts go in the answer; refuses options of the other form."""
    if f.bool("return_documents", False) and tei:
        raise bad_request("'return_documents' belongs to the 'documents' form; with 'texts' (TEI) use 'return_text'")
    if f.bool("return_text", False) and not tei:
        raise bad_request("'return_text' belongs to the TEI form ('texts'); with 'documents' use 'return_documents'")
    if not f.bool("raw_scores", True):
        raise bad_request("'raw_scores' false (sigmoid scores) is not supported: scores are the raw classifier outputs")
    if f.bool("truncate", False):
        raise bad_request("'truncate' is not supported: a query and document too long for the model are refused")
    f.str("model")
    return f.bool("return_documents", False) or f.bool("return_text", False)


async def rerank(request: Request) -> Response:
    state: ServerState = request.app.state.server
    worker, cfg = embed_worker(state, "reranking", "--reranking"), state.config
    if worker.embedder.pooling != "rank":
        raise not_supported("This server does not support reranking. Start it with `--reranking`")
    body = await read_json(request, cfg.body_limit, cfg.timeout)
    check_fields(body, FIELDS, request.url.path)
    f = Fields(body)
    query = body.get("query")
    if not isinstance(query, str):
        raise bad_request('"query" must be provided' if query is None else '"query" must be a string')
    docs, tei = _documents(f)
    top_n = f.int("top_n", len(docs), lo=0)
    with_text = _check_form_fields(f, tei)
    emb = worker.embedder
    seqs = await anyio.to_thread.run_sync(
        lambda: [rerank_tokens(emb.tokenizer, query, d, emb.rerank_template) for d in docs])
    check_lengths(seqs, worker.max_tokens)
    scores = [float(v[0, 0]) for v in await worker.embed(seqs)]
    order = sorted(range(len(docs)), key=lambda i: -scores[i])[:top_n]
    label = "score" if tei else "relevance_score"
    results = [{"index": i, label: scores[i], **_text(docs[i], tei, with_text)} for i in order]
    if tei:
        return JSONResp(results)
    n_tokens = sum(map(len, seqs))
    return JSONResp({"model": f.str("model", cfg.model_name), "object": "list",
                     "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}, "results": results})


def _text(doc: str, tei: bool, with_text: bool) -> dict:
    if not with_text:
        return {}
    return {"text": doc} if tei else {"document": {"text": doc}}


ROUTES = [Route(path, rerank, methods=["POST"])
          for path in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking")]
