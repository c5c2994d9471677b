"""llama-server's generation parameters (JSON body) -> a validated engine `Request`.

Used by /completion and, for the parameters they share, by the OpenAI routes (llama-server also
accepts its own sampling fields there). Defaults come from the command line (`GenerationDefaults`),
the rest are llama.cpp's. Every invalid value is a 400 naming the field; unknown fields are ignored.
Output constraints (`grammar`, `json_schema`, `response_format`) are compiled by constraints.py.

Every sampler llama-server accepts is honoured with llama.cpp's semantics (see
slotserver/model/sampling/chain.py): typical_p, min_keep, top_n_sigma, XTC, dynamic temperature, DRY with
its sequence breakers, mirostat 1 and 2, adaptive-p, the `samplers` order, post_sampling_probs.
Unlike llama-server, which clamps some out-of-range values and skips unknown sampler names, those
are a 400 naming the field; `dry_base` < 1 still means the default, as in llama-server.

Bounds beyond llama.cpp's: repeat_penalty in [1e-3, 1e3], presence/frequency penalties and
logit biases within +-1e6, and a logit_bias may not forbid every token. Outside these, float32
logits overflow to inf/NaN, and the engine then fails the whole step, i.e. every request in the
batch (found by the fuzz test); no meaningful setting lies outside them.
"""

from __future__ import annotations

import math
from typing import Any

from slotserver.engine.grammar import Grammars
from slotserver.engine.reasoning_budget import BudgetSpec
from slotserver.engine.request import Request, RequestError
from slotserver.engine.lora_scales import parse_entries
from slotserver.model.sampling.dry import process_breakers
from slotserver.model.sampling.order import DEFAULT_SAMPLERS
from slotserver.model.sampling.params import ADDITIVE_LIMIT, MAX_N_PROBS, REQUEST_BOUNDS, SamplingError, SamplingParams
from slotserver.server.budget_fields import completion_budget
from slotserver.server.choices import expand, n_choices
from slotserver.server.constraints import parse_constraint
from slotserver.server.errors import bad_request
from slotserver.server.fields import INT32_MAX, UINT32_MAX, Fields
from slotserver.server.job import CompletionJob  # noqa: F401  re-exported: routes and formats import it from here
from slotserver.server.prompt import parse_logit_bias, tokenize_prompts
from slotserver.server.config import GenerationDefaults
from slotserver.server.unsupported import check_completion_fields, response_fields
from slotserver.model.text.tokenizer import Tokenizer

B = REQUEST_BOUNDS   # each sampling field's range, shared with the server's flags (cli/sampling_args.py)
DRY_BREAKERS = ("\n", ":", "\"", "*")  # llama.cpp's default dry_sequence_breakers
DRY_BASE = 1.75


def sampling_params(f: Fields, tokenizer: Tokenizer, defaults: GenerationDefaults,
                    n_probs: int) -> SamplingParams:
    """The sampler settings; SamplingParams re-validates and its message names the field. `f`: the
    request's fields, over the server's flags where build_request wraps them (Fields.with_fallback)."""
    try:
        return SamplingParams(
            temperature=f.float("temperature", defaults.temperature),
            top_k=f.int("top_k", 40, *B["top_k"]),
            top_p=f.float("top_p", 0.95, *B["top_p"]),
            min_p=f.float("min_p", 0.05, *B["min_p"]),
            repeat_penalty=f.float("repeat_penalty", 1.0, *B["repeat_penalty"]),
            repeat_last_n=f.int("repeat_last_n", 64, *B["repeat_last_n"]),
            presence_penalty=f.float("presence_penalty", 0.0, *B["presence_penalty"]),
            frequency_penalty=f.float("frequency_penalty", 0.0, *B["frequency_penalty"]),
            logit_bias=_logit_bias(f, tokenizer),
            seed=f.int("seed", defaults.seed, lo=-1, hi=UINT32_MAX),
            n_probs=n_probs,
            **_chain_fields(f, tokenizer),
        )
    except SamplingError as e:
        raise bad_request(str(e)) from None


def _logit_bias(f: Fields, tokenizer: Tokenizer) -> tuple[tuple[int, float], ...]:
    """The request's `logit_bias`, else the server's `-l` flags, whose ids past this model's vocabulary
    are skipped, as llama-server skips them (a request's own are a 400 naming the id)."""
    value = f.raw("logit_bias")
    if value is not None and not f.sent("logit_bias"):
        value = [[t, b] for t, b in value if not isinstance(t, int) or t < tokenizer.vocab_size]
    return parse_logit_bias(tokenizer, value, ADDITIVE_LIMIT)


def _chain_fields(f: Fields, tokenizer: Tokenizer) -> dict[str, Any]:
    """The samplers beyond top_k/top_p/min_p/temperature (llama-server's names and defaults)."""
    dry_base = f.float("dry_base", DRY_BASE, *B["dry_base"])
    out = dict(
        post_sampling_probs=f.bool("post_sampling_probs", False),
        min_keep=f.int("min_keep", 0, lo=0),
        typical_p=f.float("typical_p", 1.0, *B["typical_p"]),
        top_n_sigma=f.float("top_n_sigma", -1.0, *B["top_n_sigma"]),
        xtc_probability=f.float("xtc_probability", 0.0, *B["xtc_probability"]),
        xtc_threshold=f.float("xtc_threshold", 0.1, *B["xtc_threshold"]),
        dynatemp_range=f.float("dynatemp_range", 0.0, *B["dynatemp_range"]),
        dynatemp_exponent=f.float("dynatemp_exponent", 1.0, *B["dynatemp_exponent"]),
        dry_multiplier=f.float("dry_multiplier", 0.0, *B["dry_multiplier"]),
        dry_base=DRY_BASE if dry_base < 1 else dry_base,
        dry_allowed_length=f.int("dry_allowed_length", 2, *B["dry_allowed_length"]),
        dry_penalty_last_n=f.int("dry_penalty_last_n", 64, *B["dry_penalty_last_n"]),
        mirostat=f.int("mirostat", 0, *B["mirostat"]),
        mirostat_tau=f.float("mirostat_tau", 5.0, *B["mirostat_tau"]),
        mirostat_eta=f.float("mirostat_eta", 0.1, *B["mirostat_eta"]),
        adaptive_target=f.float("adaptive_target", -1.0, *B["adaptive_target"]),
        adaptive_decay=f.float("adaptive_decay", 0.9, *B["adaptive_decay"]),
        samplers=_samplers_field(f),
    )
    breakers = _breakers_field(f)
    if out["dry_multiplier"] != 0 and out["dry_penalty_last_n"] != 0:  # DRY on: map breakers to tokens
        out["dry_breakers"] = process_breakers(tokenizer, breakers)
    return out


def _samplers_field(f: Fields) -> tuple[str, ...] | str:
    value = f.raw("samplers", DEFAULT_SAMPLERS)
    if not isinstance(value, (str, list, tuple)) or (
            not isinstance(value, str) and not all(isinstance(v, str) for v in value)):
        raise bad_request("'samplers' must be a string of sampler letters or an array of sampler names")
    return value if isinstance(value, str) else tuple(value)


def _breakers_field(f: Fields) -> tuple[str, ...]:
    value = f.raw("dry_sequence_breakers", DRY_BREAKERS)   # none at all only by --dry-sequence-breaker none
    if not isinstance(value, (list, tuple)) or not (value or not f.sent("dry_sequence_breakers")) \
            or not all(isinstance(v, str) for v in value):
        raise bad_request("'dry_sequence_breakers' must be a non-empty array of strings")
    return tuple(value)


def _check_something_allowed(params: SamplingParams, tokenizer: Tokenizer, ignore_eos: bool) -> None:
    forbidden = {t for t, b in params.logit_bias if b == -math.inf}
    if ignore_eos:
        forbidden |= tokenizer.eog_ids
    if len(forbidden) >= tokenizer.vocab_size:
        raise bad_request("'logit_bias' (with 'ignore_eos') forbids every token")


def build_request(f: Fields, ids: list[int], tokenizer: Tokenizer, defaults: GenerationDefaults,
                  n_predict: int, n_probs: int, stop: tuple[str, ...], grammar: str | None = None,
                  budget: BudgetSpec | None = None) -> Request:
    f = f.with_fallback(defaults.fields)
    params, ignore_eos = sampling_params(f, tokenizer, defaults, n_probs), f.bool("ignore_eos", False)
    _check_something_allowed(params, tokenizer, ignore_eos)
    return Request(
        prompt_ids=tuple(ids),
        params=params,
        n_predict=n_predict,
        n_keep=f.int("n_keep", 0, *B["n_keep"]),
        n_discard=f.int("n_discard", 0, lo=0),
        n_cache_reuse=f.int("n_cache_reuse", None, lo=0),   # None: the server's --cache-reuse
        stop=stop,
        ignore_eos=ignore_eos,
        id_slot=f.int("id_slot", -1, lo=-1),
        cache_prompt=f.bool("cache_prompt", defaults.cache_prompt),
        grammar=grammar,
        return_progress=f.bool("return_progress", False),
        timings_per_token=f.bool("timings_per_token", False),
        **speculative_fields(f),
        reasoning_budget=budget,
        lora=lora_field(f),
        n_indent=f.int("n_indent", 0, lo=0, hi=INT32_MAX),
        t_max_predict_ms=f.int("t_max_predict_ms", -1, lo=-1, hi=2**63 - 1),
        special=defaults.special,
    )


def sse_ping_field(f: Fields, defaults: GenerationDefaults) -> int:
    """llama-server's `sse_ping_interval`: seconds of silence before a streamed answer's ping
    (server/sse.py), -1 or 0 none; default `--sse-ping-interval` (30)."""
    return f.int("sse_ping_interval", defaults.sse_ping_interval, lo=-1, hi=INT32_MAX)


def lora_field(f: Fields) -> tuple[tuple[int, float], ...] | None:
    """llama-server's `lora`: [{"id": int, "scale": number}] -> (id, scale) pairs; absent, null or
    [] -> None (the server's scales). The form is checked here, the ids by the engine (which knows
    the adapters): both a 400 naming the entry (engine/lora_scales.py)."""
    value = f.raw("lora")
    if value is None or value == []:
        return None
    try:
        return parse_entries(value)
    except RequestError as e:
        raise bad_request(str(e)) from None


def speculative_fields(f: Fields) -> dict:
    """llama-server's per-request draft sizes: `speculative.n_max` (0: no speculation for this
    request), `speculative.n_min`, `speculative.p_min`; absent: the server's --spec-draft-* values."""
    n_max = f.int("speculative.n_max", -1, lo=-1, hi=INT32_MAX) if f.has("speculative.n_max") else None
    n_min = f.int("speculative.n_min", 0, lo=0, hi=INT32_MAX) if f.has("speculative.n_min") else None
    p_min = f.float("speculative.p_min", 0.0, lo=0.0, hi=1.0) if f.has("speculative.p_min") else None
    if n_max is not None and n_max < 0:
        n_max = None
    kind = f.str("speculative.type")
    if kind == "none":
        n_max = 0
    elif kind is not None:
        raise bad_request(f"'speculative.type' {kind!r} is not supported per request: the server's --spec-type "
                          "applies ('none' turns speculation off for this request)")
    if n_max is not None and n_min is not None and n_min > n_max:
        raise bad_request(f"'speculative.n_min' ({n_min}) exceeds 'speculative.n_max' ({n_max})")
    return {"spec_n_max": n_max, "spec_n_min": n_min, "spec_p_min": p_min}


def eog_bias(request: Request, tokenizer: Tokenizer) -> tuple[int, ...]:
    return tuple(sorted(tokenizer.eog_ids)) if request.ignore_eos else ()


def n_predict_field(f: Fields, defaults: GenerationDefaults, *names: str, lo: int = -2) -> int:
    """The first of `names` present (-2, llama's "until the context is full", is -1 here)."""
    for name in names:
        if f.has(name):
            return max(f.int(name, -1, lo=lo, hi=INT32_MAX), -1)
    return defaults.n_predict


def parse_completion(body: dict[str, Any], tokenizer: Tokenizer, defaults: GenerationDefaults,
                     grammars: Grammars | None = None, n_parallel: int = 1) -> list[CompletionJob]:
    """POST /completion's body -> its jobs, prompts x `n_cmpl` (choices.py); tokenizes the prompts
    and compiles a grammar: run it off the event loop. `grammars` checks a grammar against the
    model's vocabulary."""
    f = Fields(body)
    check_completion_fields(f)
    grammar = parse_constraint(f, grammars, defaults.fields)
    if "prompt" not in body:
        raise bad_request("'prompt' is required")
    n_probs = f.int("n_probs" if f.has("n_probs") else "logprobs", 0, lo=0, hi=MAX_N_PROBS)
    stop = f.str_list("stop")
    n_predict = n_predict_field(f, defaults, "n_predict", "max_completion_tokens", "max_tokens")
    fields = response_fields(f)
    stream, return_tokens = f.bool("stream", False), f.bool("return_tokens", False)
    n = n_choices(f, n_parallel, "n_cmpl", "n")
    budget = completion_budget(f, tokenizer, defaults)
    jobs = []
    for ids in tokenize_prompts(tokenizer, body["prompt"]):
        if not ids:
            raise bad_request("the prompt is empty")
        request = build_request(f, ids, tokenizer, defaults, n_predict, n_probs, stop, grammar, budget)
        jobs.append(CompletionJob(request, stream=stream, return_tokens=return_tokens, n_probs=n_probs,
                                  want_logprobs=n_probs > 0, eog_bias=eog_bias(request, tokenizer),
                                  response_fields=fields, sse_ping=sse_ping_field(f, defaults)))
    return expand(jobs, n)
