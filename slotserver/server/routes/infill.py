"""POST /infill: llama-server's fill-in-the-middle completion for code editors.

The body's infill fields (infill_request.py) become one prompt of token ids laid out as
llama-server's `format_prompt_infill` (infill_prompt.py); from there the request IS a /completion
request with that prompt: every /completion field (n_predict, samplers, seed, stop, stream,
return_tokens, n_probs, n_cmpl...) is parsed by params.py and answered in /completion's shapes,
streaming or not, as llama-server does (`handle_completions_impl` with the token prompt).

A model without FIM prefix/suffix/middle tokens gets llama-server's 501 before the body is read.
The layout's budgets use the server's `-b`, `-n` and a slot's context (infill_prompt.py).
"""

from __future__ import annotations

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from slotserver.server.body import read_json
from slotserver.server.infill_prompt import FimTokens, InfillBudget, format_infill
from slotserver.server.infill_request import parse_infill
from slotserver.server.params import CompletionJob, parse_completion
from slotserver.server.prompt import prompt_text
from slotserver.server.routes.completion import run_llama_jobs
from slotserver.server.state import ServerState


def infill_jobs(state: ServerState, body: dict) -> tuple[list[CompletionJob], list[str]]:
    """The body -> /completion jobs on the FIM prompt, and that prompt's text (the response's
    `prompt`). Tokenizes and may compile a grammar: run it off the event loop."""
    bundle, engine = state.require()
    tokenizer, cfg = bundle.tokenizer, state.config
    fim = FimTokens.of(tokenizer)
    budget = InfillBudget(n_batch=engine.config.batch_size, n_predict=cfg.defaults.n_predict,
                          n_ctx=engine.config.n_cells, spm=cfg.spm_infill)
    ids = format_infill(tokenizer, fim, parse_infill(body, tokenizer), budget)
    jobs = parse_completion({**body, "prompt": ids}, tokenizer, cfg.defaults,
                            getattr(engine, "grammars", None), engine.config.n_parallel)
    return jobs, [prompt_text(tokenizer, j.request.prompt_ids) for j in jobs]


async def infill(request: Request) -> Response:
    state: ServerState = request.app.state.server
    bundle, _ = state.require()
    FimTokens.of(bundle.tokenizer)   # 501 for a model without FIM tokens, whatever the body
    cfg = state.config
    body = await read_json(request, cfg.body_limit, cfg.timeout)
    jobs, prompts = await anyio.to_thread.run_sync(infill_jobs, state, body)
    return await run_llama_jobs(request, state, jobs, prompts)


ROUTES = [Route("/infill", infill, methods=["POST"])]
