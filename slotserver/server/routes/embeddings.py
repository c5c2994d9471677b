"""POST /embedding, /embeddings (llama-server's format) and /v1/embeddings (OpenAI's), on an --embedding server.

Fields: `input` (or `content`; see embed_inputs.py for the shapes), `encoding_format` (`float`,
the default, or `base64`: the float32 little-endian bytes, OpenAI's form, which its SDK asks for
by default), `embd_normalize` (-1 none, 0 max-abs int16, 1 taxicab, 2 euclidean (the default),
p > 2 p-norm; pooled vectors only), `model` (echoed), OpenAI's `dimensions` (only the model's own
size: shortened embeddings are not computed) and `user` (no effect, as at OpenAI). Anything else
is a 400 naming it.

Answers, as llama-server's:
- /v1/embeddings: `{"model", "object": "list", "usage": {"prompt_tokens", "total_tokens"}, "data":
  [{"embedding", "index", "object": "embedding"}]}`; with pooling none a 400 (per-token vectors
  are not an OpenAI answer); a body with `content` instead of `input` gets the llama form;
- /embedding(s): `[{"index", "embedding": [[...]]}]`: one vector per input, or with pooling none
  one unnormalized vector per token ([CLS] and [SEP] included).
"""

from __future__ import annotations

import base64

import anyio
import numpy as np
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from slotserver.model.encoder.pooling import normalize
from slotserver.server.body import read_json
from slotserver.server.embed_inputs import check_fields, check_lengths, input_tokens
from slotserver.server.embed_worker import EmbedWorker
from slotserver.server.errors import bad_request, not_supported
from slotserver.server.fields import Fields
from slotserver.server.jsonio import JSONResp
from slotserver.server.state import ServerState

FIELDS = frozenset({"input", "content", "model", "encoding_format", "embd_normalize", "dimensions", "user"})


def embed_worker(state: ServerState, what: str = "embeddings", flag: str = "--embeddings") -> EmbedWorker:
    """The server's embedding worker, or llama-server's 501 for a server started without it."""
    if state.embedder is None:
        raise not_supported(f"This server does not support {what}. Start it with `{flag}`")
    return state.embedder


async def embedding_llama(request: Request) -> Response:
    return await _serve(request, oai=False)


async def embeddings_oai(request: Request) -> Response:
    return await _serve(request, oai=True)


def _options(f: Fields, worker: EmbedWorker, default_norm: int) -> tuple[bool, int]:
    """(base64?, embd_normalize) after checking every option field."""
    fmt = f.str("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise bad_request("The format to return the embeddings in. Can be either float or base64")
    norm = f.int("embd_normalize", default_norm, lo=-1)
    if worker.embedder.pooling == "none" and f.has("embd_normalize") and norm != -1:
        raise bad_request("'embd_normalize' has no effect with pooling none: per-token vectors are returned "
                          "unnormalized (only -1 is accepted)")
    dims = f.int("dimensions", worker.embedder.dims, lo=1)
    if dims != worker.embedder.dims:
        raise bad_request(f"'dimensions' must be {worker.embedder.dims}, this model's embedding size "
                          "(shortened embeddings are not supported)")
    f.str("user")
    f.str("model")
    return fmt == "base64", norm


async def _serve(request: Request, oai: bool) -> Response:
    state: ServerState = request.app.state.server
    worker, cfg = embed_worker(state), state.config
    if oai and worker.embedder.pooling == "none":
        raise bad_request("Pooling type 'none' is not OAI compatible. Please use a different pooling type")
    body = await read_json(request, cfg.body_limit, cfg.timeout)
    check_fields(body, FIELDS, request.url.path)
    f = Fields(body)
    if "input" in body:
        value, field = body["input"], "input"
    elif "content" in body:
        value, field, oai = body["content"], "content", False   # llama's field: llama's answer
    else:
        raise bad_request('"input" or "content" must be provided')
    use_b64, norm = _options(f, worker, cfg.embedding.normalize if cfg.embedding else 2)
    seqs = await anyio.to_thread.run_sync(input_tokens, worker.embedder.tokenizer, value, field)
    check_lengths(seqs, worker.max_tokens)
    vectors = await worker.embed(seqs)
    if worker.embedder.pooling == "none":
        rows = [v.tolist() for v in vectors]                    # per token, unnormalized
    else:
        rows = [[normalize(v[0], norm)] for v in vectors]
    if not oai:
        return JSONResp([{"index": i, "embedding": r} for i, r in enumerate(rows)])
    n_tokens = sum(map(len, seqs))
    data = [_oai_item(i, r[0], use_b64) for i, r in enumerate(rows)]
    return JSONResp({"model": f.str("model", cfg.model_name), "object": "list",
                     "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}, "data": data})


def _oai_item(index: int, vector: list[float], use_b64: bool) -> dict:
    if not use_b64:
        return {"embedding": vector, "index": index, "object": "embedding"}
    raw = np.asarray(vector, dtype="<f4").tobytes()
    return {"embedding": base64.b64encode(raw).decode("ascii"), "index": index, "object": "embedding",
            "encoding_format": "base64"}


ROUTES = [
    Route("/embedding", embedding_llama, methods=["POST"]),
    Route("/embeddings", embedding_llama, methods=["POST"]),
    Route("/v1/embeddings", embeddings_oai, methods=["POST"]),
]
