"""Small llama-server endpoints: health, tokenize/detokenize, apply-template, props, models
(and OpenAI's GET /v1/models/{id}).

/tokenize defaults as in llama-server: `add_special` false, `parse_special` true; `with_pieces`
gives `[{"id", "piece"}]`, the piece a string, or its byte values when it is not valid UTF-8 on
its own (part of a multi-byte character). /detokenize renders special tokens, so it inverts
/tokenize with parse_special.
"""

from __future__ import annotations

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from slotserver import __version__
from slotserver.runtime.device import describe
from slotserver.runtime.kernel_paths import cpu_report
from slotserver.server.body import read_json
from slotserver.server.errors import bad_request, loading_error, model_not_found, not_supported
from slotserver.server.fields import Fields
from slotserver.server.jsonio import JSONResp
from slotserver.server.openai_params import render_chat_request
from slotserver.server.tools.request import parse_tools
from slotserver.server.prompt import check_token_ids, encode
from slotserver.server.state import ServerState

BUILD_INFO = f"slotserver {__version__}"


async def health(request: Request) -> Response:
    state: ServerState = request.app.state.server
    if not state.ready:
        return loading_error().response()
    return JSONResp({"status": "ok"})


def _piece(raw: bytes) -> str | list[int]:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


async def tokenize(request: Request) -> Response:
    state: ServerState = request.app.state.server
    tok = state.tokenizer()
    f = Fields(await read_json(request, state.config.body_limit, state.config.timeout))
    content = f.str("content", "")
    add_special, parse_special = f.bool("add_special", False), f.bool("parse_special", True)
    with_pieces = f.bool("with_pieces", False)
    ids = await anyio.to_thread.run_sync(encode, tok, content, add_special, parse_special)
    if with_pieces:
        pieces = [{"id": t, "piece": _piece(tok.token_bytes(t, special=True))} for t in ids]
        return JSONResp({"tokens": pieces})
    return JSONResp({"tokens": ids})


async def detokenize(request: Request) -> Response:
    state: ServerState = request.app.state.server
    tok = state.tokenizer()
    f = Fields(await read_json(request, state.config.body_limit, state.config.timeout))
    tokens = f.raw("tokens", [])
    if not isinstance(tokens, list):
        raise bad_request("'tokens' must be a list of token ids")
    check_token_ids(tokens, tok.vocab_size, "'tokens'")
    return JSONResp({"content": tok.decode(tokens, special=True)})


async def apply_template(request: Request) -> Response:
    state: ServerState = request.app.state.server
    state.require()
    f = Fields(await read_json(request, state.config.body_limit, state.config.timeout))

    def render() -> str:   # as a chat request renders it: tools, continuation, chat_template_kwargs
        chat = state.config.chat
        tools = parse_tools(f, state.template.source, chat.tool_format)
        return render_chat_request(f, state.template, tools, chat)[0]

    return JSONResp({"prompt": await anyio.to_thread.run_sync(render)})


def default_generation_settings(state: ServerState) -> dict:
    _, engine = state.require()
    d = state.config.defaults
    params = {"n_predict": d.n_predict, "seed": d.seed, "temperature": d.temperature, "top_k": 40,
              "top_p": 0.95, "min_p": 0.05, "repeat_last_n": 64, "repeat_penalty": 1.0,
              "presence_penalty": 0.0, "frequency_penalty": 0.0, "n_keep": 0, "ignore_eos": False,
              "stream": False, "n_probs": 0, "cache_prompt": d.cache_prompt, "stop": []}
    params |= d.fields   # --top-k & co. (cli/sampling_args.py): what a request gets without the field
    return {"id": 0, "id_task": -1, "n_ctx": engine.config.n_cells, "is_processing": False, "params": params}


async def props(request: Request) -> Response:
    state: ServerState = request.app.state.server
    if state.engine is None and state.embedder is not None:
        return JSONResp(_embedding_props(state))
    bundle, engine = state.require()
    tok = bundle.tokenizer

    def piece(token: int | None) -> str:
        return "" if token is None else tok.decode([token], special=True)

    return JSONResp({
        "default_generation_settings": default_generation_settings(state),
        "total_slots": engine.config.n_parallel,
        "is_sleeping": engine.sleeper.is_sleeping,   # --sleep-idle-seconds (llama-server's field)
        "model_alias": state.config.model_name,   # as llama-server: --alias, else the file's name
        "model_path": state.config.model_path,
        "dtype": str(bundle.model.dtype).removeprefix("torch."),   # ours: what the model computes in
        "weights": bundle.config.weight_format.kind,              # ours: the matmul weights' format
        "gpu_weights": bundle.config.gpu_weights,                 # ours: --gpu-weights, auto resolved at load
        "device": describe(bundle.model.device),                  # ours: cpu, or cuda:N (card name)
        "async_steps": {"mode": engine.config.async_steps, "on": engine.overlap.enabled},   # ours: overlapped decode
        "modalities": {"vision": False, "audio": False},
        "endpoint_slots": state.config.slots_endpoint,
        "endpoint_metrics": state.config.metrics,
        "endpoint_props": state.config.props_endpoint,
        "ui": state.config.webui,
        "ui_settings": state.config.ui_settings,   # --ui-config(-file)
        "chat_template": state.template.source,
        "chat_template_caps": state.template.caps.to_map(),
        "bos_token": piece(tok.bos_id),
        "eos_token": piece(tok.eos_id),
        "build_info": BUILD_INFO,
        "cpu": cpu_report({op: m.module for op, m in bundle.model.kernels.modules.items()}, bundle.model.kernels.impl),
        "tensor_parallel": getattr(engine, "tp_memory", None),   # ours: --tp's ranks and their memory, else null
    })


async def props_change(request: Request) -> Response:
    """POST /props: llama-server's endpoint behind --props, which changes no property there either
    (its handler is empty). Here a property named in the body is a 400 naming it rather than a
    success that did nothing."""
    state: ServerState = request.app.state.server
    if not state.config.props_endpoint:
        raise not_supported("This server does not support changing global properties. Start it with `--props`")
    body = await read_json(request, state.config.body_limit, state.config.timeout, allow_empty=True)
    if body:
        raise bad_request(f"'{next(iter(body))}': no global property can be changed at run time here (restart the "
                          "server with the flag instead)")
    return JSONResp({"success": True})


def _embedding_props(state: ServerState) -> dict:
    """/props of an embedding-only server: what it serves and how (no generation settings)."""
    e, tok = state.embedder.embedder, state.tokenizer()
    return {"total_slots": 1, "model_alias": state.config.model_name, "model_path": state.config.model_path,
            "embedding": True, "pooling": e.pooling, "n_embd": e.dims, "reranking": e.pooling == "rank",
            "device": "cpu", "is_sleeping": False, "modalities": {"vision": False, "audio": False},
            "endpoint_slots": state.config.slots_endpoint, "endpoint_metrics": state.config.metrics,
            "bos_token": tok.decode([tok.bos_id], special=True) if tok.bos_id is not None else "",
            "eos_token": tok.decode([tok.eos_id], special=True) if tok.eos_id is not None else "",
            "build_info": BUILD_INFO}


def _model_object(state: ServerState) -> dict:
    """OpenAI's model object for the one model served, with llama-server's `meta`."""
    c = state.config
    if state.engine is None and state.embedder is not None:
        e = state.embedder.embedder
        meta = {"n_vocab": e.tokenizer.vocab_size, "n_ctx_train": e.ctx_train, "n_embd": e.dims}
    else:
        bundle, engine = state.require()
        spec = bundle.model.spec
        meta = {"vocab_type": 2 if bundle.tokenizer.model == "gpt2" else 1, "n_vocab": spec.vocab_size,
                "n_ctx_train": spec.ctx_train, "n_embd": spec.d_model, "n_ctx_slot": engine.config.n_cells}
    return {"id": c.model_name, "aliases": c.aliases, "tags": c.tag_list, "object": "model", "created": state.created,
            "owned_by": "slotserver", "meta": meta}


async def models(request: Request) -> Response:
    state: ServerState = request.app.state.server
    name = state.config.model_name
    return JSONResp({
        "object": "list",
        "data": [_model_object(state)],
        "models": [{"name": name, "model": name, "type": "model",
                    "capabilities": ["embedding" if state.engine is None and state.embedder else "completion"]}],
    })


async def model(request: Request) -> Response:
    """GET /v1/models/{id} (the OpenAI SDK's `models.retrieve`): the model, or OpenAI's 404."""
    state: ServerState = request.app.state.server
    model_id = request.path_params["model_id"]
    if not state.config.knows_model(model_id):
        raise model_not_found(model_id)
    return JSONResp(_model_object(state))


ROUTES = [
    Route("/health", health, methods=["GET"]),
    Route("/v1/health", health, methods=["GET"]),
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
    Route("/apply-template", apply_template, methods=["POST"]),
    Route("/props", props, methods=["GET"]),
    Route("/props", props_change, methods=["POST"]),
    Route("/models", models, methods=["GET"]),
    Route("/v1/models", models, methods=["GET"]),
    Route("/v1/models/{model_id:path}", model, methods=["GET"]),
]
