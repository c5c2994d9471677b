"""What the benchmark asks the server before it starts: the model's name and vocabulary size.

Both come from GET /v1/models, which llama-server and slotserver answer with
`data[0].id` and `data[0].meta.n_vocab`. vLLM's answer has no `meta`: pass `--vocab-size` (or
`--dataset`) there. The model name is only a default for the OpenAI `model` field; when the
server cannot say, requests go without one (llama-server and slotserver do not need it).
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from slotserver.bench.client import headers, http_error
from slotserver.bench.config import BenchConfig


class BenchError(Exception):
    """The benchmark cannot run (e.g. the server cannot say its vocabulary size); one line."""


@dataclass(frozen=True)
class ServerInfo:
    model: str | None
    n_vocab: int | None


def parse_models(body: object) -> ServerInfo:
    """The first model's id and `meta.n_vocab` from a /v1/models answer, None where absent."""
    data = body.get("data") if isinstance(body, dict) else None
    first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
    model = first.get("id") if isinstance(first.get("id"), str) else None
    meta = first.get("meta") if isinstance(first.get("meta"), dict) else {}
    n_vocab = meta.get("n_vocab")
    ok = isinstance(n_vocab, int) and not isinstance(n_vocab, bool) and n_vocab > 0
    return ServerInfo(model, n_vocab if ok else None)


async def fetch_models(http: httpx.AsyncClient, cfg: BenchConfig) -> tuple[ServerInfo, str]:
    """(info, "") on success, (empty info, why not) when /v1/models cannot be read."""
    url = cfg.base_url + "/v1/models"
    try:
        r = await http.get(url, headers=headers(cfg.api_key))
    except httpx.HTTPError as e:
        return ServerInfo(None, None), f"{url}: {type(e).__name__}: {e}"
    if r.status_code != 200:
        return ServerInfo(None, None), f"{url}: {http_error(r.status_code, r.content)}"
    try:
        return parse_models(r.json()), ""
    except ValueError:
        return ServerInfo(None, None), f"{url}: the answer is not JSON"


async def resolve(http: httpx.AsyncClient, cfg: BenchConfig) -> ServerInfo:
    """The model name and vocabulary size to use, asking the server only for what is missing."""
    need_vocab = cfg.dataset is None and cfg.vocab_size is None
    need_model = cfg.backend == "openai" and cfg.model is None
    info, why = ServerInfo(cfg.model, cfg.vocab_size), ""
    if need_vocab or need_model:
        asked, why = await fetch_models(http, cfg)
        info = ServerInfo(cfg.model or asked.model, cfg.vocab_size or asked.n_vocab)
    if need_vocab and info.n_vocab is None:
        reason = why or f"{cfg.base_url}/v1/models has no data[0].meta.n_vocab"
        raise BenchError(f"cannot get the vocabulary size for random prompts ({reason}); "
                         "pass --vocab-size N or --dataset FILE")
    return info
