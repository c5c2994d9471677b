"""llama-server's /completion answers: the final object, stream chunks, probabilities, timings.

Field names and meanings follow llama.cpp's tools/server (the `to_json_non_oaicompat_*` results):
`stop_type` is "eos", "limit", "word" or "none" (cancelled); `timings` are per request;
`completion_probabilities` uses the current format, one entry per generated token with its
`top_logprobs`, the end-of-generation token included (as llama-server: `tokens_predicted` entries).
Token text in probabilities is the token's raw piece (special tokens rendered), except a generated
end-of-generation token's, which adds no text to the answer: its piece unrendered ('' for a control
token), as llama-server shows it. `bytes` are the text's exact bytes, which matter when a token
holds part of a UTF-8 character.
"""

from __future__ import annotations

import math

from slotserver.engine.request import FinalEvent, ProgressEvent, TokenEvent
from slotserver.server.generation import Outcome
from slotserver.server.params import CompletionJob
from slotserver.server.sse import event as sse_event
from slotserver.server.sse_template import SSETemplate, hole, json_ints, json_str
from slotserver.model.text.tokenizer import Tokenizer


def token_entry(tokenizer: Tokenizer, token: int, logprob: float | None, as_prob: bool = False,
                special: bool = False) -> dict:
    """llama-server's entry: `logprob`, or with `post_sampling_probs` the probability `prob`;
    `special` (--special): a control token's text rendered (else '', as the answer's text has it)."""
    raw = tokenizer.token_bytes(token, special=special)
    value = ("prob", None if logprob is None else math.exp(logprob)) if as_prob else ("logprob", logprob)
    return {"id": token, "token": raw.decode("utf-8", "replace"), value[0]: value[1], "bytes": list(raw)}


def probabilities(tokenizer: Tokenizer, events: list[TokenEvent], n_probs: int, post_sampling: bool = False,
                  special: bool = False) -> list[dict]:
    """One entry per token with its top `n_probs`: `top_logprobs` of the model's own distribution
    (before bias and samplers), or with `post_sampling_probs` `top_probs` after the sampler chain."""
    out, key = [], "top_probs" if post_sampling else "top_logprobs"
    for ev in events:
        entry = token_entry(tokenizer, ev.token, ev.logprob, post_sampling, special)
        entry[key] = [token_entry(tokenizer, t, lp, post_sampling, special) for t, lp in ev.top[:n_probs]]
        out.append(entry)
    return out


def _per(n: int, ms: float) -> tuple[float, float]:
    """(ms per token, tokens per second), 0 when undefined."""
    return (ms / n if n else 0.0, 1000.0 * n / ms if ms > 0 else 0.0)


def timings(final: FinalEvent) -> dict:
    """llama-server's timings. The generation rate is over n - 1 tokens: the first token comes from
    the prompt's last batch and `predicted_ms` runs from it to the last one."""
    prompt_n = final.n_prompt - final.n_cached
    p_tok, p_sec = _per(prompt_n, final.prompt_ms)
    g_tok, g_sec = _per(max(final.n_predicted - 1, 0), final.predicted_ms)
    out = {
        "cache_n": final.n_cached, "prompt_n": prompt_n, "prompt_ms": final.prompt_ms,
        "prompt_per_token_ms": p_tok, "prompt_per_second": p_sec,
        "predicted_n": final.n_predicted, "predicted_ms": final.predicted_ms,
        "predicted_per_token_ms": g_tok, "predicted_per_second": g_sec,
    }
    if final.draft_n > 0:   # speculative decoding, as llama-server: only once something was drafted
        out.update(draft_n=final.draft_n, draft_n_accepted=final.draft_n_accepted)
    return out


def logit_bias_settings(job: CompletionJob) -> list[dict]:
    """llama-server's `generation_settings.logit_bias`: {bias, token}, -inf as null; with ignore_eos
    the end-of-generation tokens' -inf biases are listed too, as llama-server adds them."""
    pairs = list(job.request.params.logit_bias) + [(t, float("-inf")) for t in job.eog_bias]
    return [{"bias": None if b == float("-inf") else b, "token": t} for t, b in pairs]


def generation_settings(job: CompletionJob, seed: int, model: str) -> dict:
    r, p = job.request, job.request.params
    return {
        "model": model, "n_predict": r.n_predict, "seed": seed, "temperature": p.temperature,
        "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p, "repeat_last_n": p.repeat_last_n,
        "repeat_penalty": p.repeat_penalty, "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty, "n_keep": r.n_keep, "ignore_eos": r.ignore_eos,
        "stream": job.stream, "n_probs": job.n_probs, "cache_prompt": r.cache_prompt,
        "stop": list(r.stop), "id_slot": r.id_slot,
        "logit_bias": logit_bias_settings(job),
    }


def summary(job: CompletionJob, final: FinalEvent, model: str, prompt: str) -> dict:
    """The fields that close a request (also the last stream chunk)."""
    return {
        "id_slot": final.id_slot, "stop": True, "model": model,
        "tokens_predicted": final.n_predicted, "tokens_evaluated": final.n_prompt,
        "generation_settings": generation_settings(job, final.seed, model), "prompt": prompt,
        "truncated": final.truncated, "stop_type": final.stop_type, "stopping_word": final.stopping_word,
        "tokens_cached": final.n_cached, "timings": timings(final),
    }


def select_fields(paths: tuple[str, ...], body: dict) -> dict:
    """llama-server's `response_fields` (json_get_nested_values): only the listed paths, each under
    its path as the key ("generation_settings/n_predict"); paths that lead nowhere are left out."""
    if not paths:
        return body
    out = {}
    for path in paths:
        value, found = body, True
        for key in path.split("/"):
            if not (isinstance(value, dict) and key in value):
                found = False
                break
            value = value[key]
        if found:
            out[path] = value
    return out


def final_response(job: CompletionJob, out: Outcome, tokenizer: Tokenizer, model: str, prompt: str) -> dict:
    body = {"index": job.index, "content": out.text, "tokens": out.token_ids if job.return_tokens else [],
            "has_new_line": "\n" in out.text}
    body.update(summary(job, out.final, model, prompt))
    if job.n_probs > 0:
        body["completion_probabilities"] = probabilities(tokenizer, out.tokens, job.n_probs, job.request.params.post_sampling_probs,
                                                         job.request.special)
    return select_fields(job.response_fields, body)


def stream_chunk(job: CompletionJob, text: str, events: list[TokenEvent], tokenizer: Tokenizer,
                 n_predicted: int) -> dict:
    chunk = {"index": job.index, "content": text, "tokens": [e.token for e in events], "stop": False,
             "tokens_predicted": n_predicted, "tokens_evaluated": len(job.request.prompt_ids)}
    if job.n_probs > 0:
        chunk["completion_probabilities"] = probabilities(tokenizer, events, job.n_probs, job.request.params.post_sampling_probs,
                                                          job.request.special)
    if events and events[-1].timings is not None:
        chunk["timings"] = timings(events[-1].timings)
    return chunk


class StreamEvents:
    """One job's `stream_chunk`s as SSE events, the same bytes; a chunk without probabilities or
    timings (nearly every one) is filled into a template (sse_template.py)."""

    def __init__(self, job: CompletionJob, tokenizer: Tokenizer) -> None:
        self.job, self.tokenizer = job, tokenizer
        self._template = None
        if job.n_probs <= 0:   # holes: content, tokens, tokens_predicted (stream_chunk's own keys and order)
            chunk = stream_chunk(job, hole(0), [], tokenizer, 0)
            chunk.update(tokens=hole(1), tokens_predicted=hole(2))
            self._template = SSETemplate.make(chunk, 3)

    def event(self, text: str, events: list[TokenEvent], n_predicted: int) -> bytes:
        if self._template is None or (events and events[-1].timings is not None):
            return sse_event(stream_chunk(self.job, text, events, self.tokenizer, n_predicted))
        return self._template.fill(json_str(text), json_ints([e.token for e in events]), str(n_predicted).encode())


def progress_chunk(job: CompletionJob, ev: ProgressEvent) -> dict:
    """return_progress: llama-server's partial result with `prompt_progress` and `timings`."""
    return {"index": job.index, "content": "", "tokens": [], "stop": False, "id_slot": ev.timings.id_slot,
            "tokens_predicted": 0, "tokens_evaluated": ev.total, "timings": timings(ev.timings),
            "prompt_progress": {"total": ev.total, "cache": ev.cache, "processed": ev.processed,
                                "time_ms": ev.time_ms}}


def final_chunk(job: CompletionJob, final: FinalEvent, model: str, prompt: str) -> dict:
    chunk = {"index": job.index, "content": "", "tokens": []}
    chunk.update(summary(job, final, model, prompt))
    return select_fields(job.response_fields, chunk)
