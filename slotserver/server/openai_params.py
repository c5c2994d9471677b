"""OpenAI request bodies (/v1/completions, /v1/chat/completions) -> a CompletionJob.

OpenAI's names map onto llama-server's: `max_tokens` / `max_completion_tokens` -> n_predict,
`logprobs` / `top_logprobs` -> n_probs; llama-server's own sampling fields (top_k, min_p,
repeat_penalty...) are accepted too, as llama-server does. What we cannot honour is refused with a
400 instead of being silently ignored: `best_of` > 1, `echo`, `suffix`, `tools` on /v1/completions. `n` and prompt lists:
choices.py.
Chat `tools`, `tool_choice` and `parallel_tool_calls`: tools/request.py, tools/prompt.py, tools/calls.py.
`response_format` (and llama-server's `grammar` / `json_schema`) constrain the output (constraints.py). Chat prompts come from the model's (or the command line's)
chat template only: a `chat_template` field in the body is ignored like any unknown field.
`chat_template_kwargs`, `reasoning_effort`, `reasoning_format`: chat_options.py; the reasoning
budget: budget_fields.py; the `<think>` split of the answer: reasoning.py. Fields llama-server reads that we
do not implement are refused by unsupported.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from slotserver.model.text.chat_template import ChatTemplate
from slotserver.server.errors import bad_request
from slotserver.server.fields import Fields
from slotserver.engine.grammar import Grammars
from slotserver.server.constraints import compile_checked, default_constraint, parse_constraint, requested
from slotserver.server.tools.prompt import render_with_tools
from slotserver.server.tools.formats import QWEN_XML
from slotserver.server.tools.grammar import forced_call_grammar
from slotserver.server.tools.request import ToolConfig, parse_tools
from slotserver.server.params import CompletionJob, build_request, eog_bias, n_predict_field, sse_ping_field
from slotserver.server.choices import expand, n_choices
from slotserver.server.chat_options import ChatDefaults, chat_options
from slotserver.server.harmony import BUDGET_TAGS as HARMONY_BUDGET_TAGS
from slotserver.server.harmony import answer_prefix, in_analysis, template_is_harmony
from slotserver.server.reasoning import THINK, ReasoningMode, answer_start, template_thinks
from slotserver.server.budget_fields import THINK_TAGS, chat_budget, completion_budget
from slotserver.engine.reasoning_budget import BudgetSpec
from slotserver.server.unsupported import check_chat_fields, check_completion_fields
from slotserver.server.prompt import encode, prompt_text, tokenize_prompts
from slotserver.server.config import GenerationDefaults
from slotserver.model.text.tokenizer import Tokenizer

MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class OpenAIJob:
    jobs: list[CompletionJob]   # prompts x n choices, by index (choices.py)
    model: str                  # echoed back in the answer, as OpenAI and llama-server do
    prompts: list[str]          # each job's prompt as llama-server echoes it (prompt.prompt_text)
    tools: ToolConfig | None = None   # chat: the tools offered and how calls are chosen
    reasoning: ReasoningMode = ReasoningMode()   # chat: how the answer's <think> block is split off

    @property
    def job(self) -> CompletionJob:
        return self.jobs[0]


def _refuse_unsupported(f: Fields) -> None:
    if f.int("best_of", 1, lo=1) != 1:
        raise bad_request("only best_of=1 is supported")
    if f.bool("echo", False):
        raise bad_request("'echo' is not supported")
    if f.str("suffix"):
        raise bad_request("'suffix' is not supported")


def _stream_flags(f: Fields) -> tuple[bool, bool]:
    stream = f.bool("stream", False)
    options = f.obj("stream_options") or {}
    usage = Fields(options).bool("include_usage", False) if stream else False
    return stream, usage


def _job(f: Fields, ids: list[int], tokenizer: Tokenizer, defaults: GenerationDefaults,
         n_top: int, want_logprobs: bool, grammar: str | None, budget: BudgetSpec | None) -> CompletionJob:
    if not ids:
        raise bad_request("the prompt is empty")
    n_predict = n_predict_field(f, defaults, "max_completion_tokens", "max_tokens", "n_predict", lo=1)
    engine_probs = max(n_top, 1) if want_logprobs else 0   # the chosen token's logprob needs >= 1
    request = build_request(f, ids, tokenizer, defaults, n_predict, engine_probs, f.str_list("stop"), grammar,
                            budget)
    stream, usage = _stream_flags(f)
    return CompletionJob(request, stream=stream, n_probs=n_top, want_logprobs=want_logprobs,
                         include_usage=usage, eog_bias=eog_bias(request, tokenizer), sse_ping=sse_ping_field(f, defaults))


def parse_openai_completion(body: dict[str, Any], tokenizer: Tokenizer, defaults: GenerationDefaults,
                            default_model: str, grammars: Grammars | None = None, n_parallel: int = 1) -> OpenAIJob:
    f = Fields(body)
    _refuse_unsupported(f)
    check_completion_fields(f)
    if f.raw("tools"):
        raise bad_request("'tools' (function calling) is a chat feature: use /v1/chat/completions")
    grammar = parse_constraint(f, grammars, defaults.fields)
    if "prompt" not in body:
        raise bad_request("'prompt' is required")
    n = n_choices(f, n_parallel, "n")
    n_top = f.int("logprobs", -1, lo=0, hi=MAX_TOP_LOGPROBS)   # legacy API: an int, 0 = chosen only
    budget = completion_budget(f, tokenizer, defaults)
    jobs = [_job(f, ids, tokenizer, defaults, max(n_top, 0), n_top >= 0, grammar, budget)
            for ids in tokenize_prompts(tokenizer, body["prompt"])]
    jobs = expand(jobs, n)
    return OpenAIJob(jobs, f.str("model", default_model) or default_model,
                     [prompt_text(tokenizer, j.request.prompt_ids) for j in jobs])


def _chat_grammar(f: Fields, tools: ToolConfig, grammars: Grammars | None,
                  fallback: Mapping[str, Any], pure: bool = False, think_open: bool = False) -> str | None:
    """A forced tool call's grammar, else the request's own constraint (not both, as llama-server),
    else with no tools the server's (--grammar, --json-schema). `pure` (--skip-chat-parsing): no
    tool-call grammar, as llama.cpp's pure content parser sets none. `think_open`: the prompt ends
    inside a `<think>` block (Qwen3.5, GLM-4.7): the forced call may close it first, as llama.cpp's
    grammars allow (`( "</think>" space )?` before the call)."""
    found = requested(f) or (None if tools.active else default_constraint(fallback))
    if tools.active and found is not None:
        raise bad_request(f"'{found[0]}' cannot constrain the output together with 'tools' "
                          "(use tool_choice \"none\", or drop it)")
    if tools.forced and not pure:
        return compile_checked("tool_choice", "lark", forced_call_grammar(tools, think_open), grammars)
    return compile_checked(*found, grammars) if found else None


def _continuation(f: Fields, messages: Any, prefill: bool = True) -> tuple[bool, bool]:
    """(add_generation_prompt, continue_final_message) with llama-server's rules: a final assistant
    message is continued (prefill) unless said otherwise (or `--no-prefill-assistant`); both at once is a 400."""
    add = f.bool("add_generation_prompt", True)
    raw = f.raw("continue_final_message", False)
    if raw not in (True, False, "content"):
        raise bad_request("'continue_final_message' must be true, false or \"content\"")
    cont = raw is not False
    last = messages[-1] if isinstance(messages, list) and messages and isinstance(messages[-1], dict) else {}
    if not cont and prefill and last.get("role") == "assistant":
        before = messages[-2] if len(messages) >= 2 and isinstance(messages[-2], dict) else {}
        if before.get("role") == "assistant":
            raise bad_request("Cannot have 2 or more assistant messages at the end of the list.")
        cont, add = True, False
    if cont and add:
        raise bad_request("Cannot set both add_generation_prompt and continue_final_message to true.")
    if cont and last.get("tool_calls"):
        raise bad_request("Cannot continue an assistant message that contains tool calls.")
    return add, cont


def render_chat_request(f: Fields, template: ChatTemplate, tools: ToolConfig,
                        chat: ChatDefaults) -> tuple[str, ReasoningMode]:
    """A chat body's prompt text (also /apply-template's answer) and how its answer is split:
    continuation, tools, chat_template_kwargs and the thinking switches, as llama-server."""
    if "messages" not in f.body:
        raise bad_request("'messages' is required")
    messages = f.body["messages"]
    add_prompt, cont = _continuation(f, messages, chat.prefill_assistant)
    options = chat_options(f, chat)
    text = render_with_tools(template, messages, tools, add_prompt, cont, variables=options.context)
    continued = (messages[-1].get("content") or "") if cont else None
    harmony = answer_prefix(text) if template_is_harmony(template.source) and not chat.pure_content else None
    ends = ("<tool_call>",) if tools.active and tools.format == QWEN_XML else ()   # llama.cpp's qwen3-coder parser
    return text, ReasoningMode(options.reasoning_format, answer_start(text, continued), harmony, ends)


def _chat_logprobs(f: Fields) -> tuple[bool, int]:
    """(logprobs, top_logprobs). `top_logprobs` alone would return none of what it asks for, so
    it is a 400 naming both fields, as OpenAI and llama-server answer (not silently dropped)."""
    want = f.bool("logprobs", False)
    if f.raw("top_logprobs") is not None and not want:
        raise bad_request("'top_logprobs' requires 'logprobs': true (send both, or neither)")
    return want, f.int("top_logprobs", 0, lo=0, hi=MAX_TOP_LOGPROBS)


def _budget_block(template: ChatTemplate, mode: ReasoningMode) -> tuple[tuple | None, bool]:
    """The template's reasoning block for the budget (its tags, or None) and whether the prompt
    leaves it open."""
    if mode.harmony is not None:
        return HARMONY_BUDGET_TAGS, in_analysis(mode.harmony)
    return (THINK_TAGS if template_thinks(template.source) else None), mode.start == THINK


def parse_chat(body: dict[str, Any], tokenizer: Tokenizer, template: ChatTemplate,
               defaults: GenerationDefaults, default_model: str, grammars: Grammars | None = None,
               n_parallel: int = 1, chat: ChatDefaults | None = None) -> OpenAIJob:
    f = Fields(body)
    _refuse_unsupported(f)
    check_chat_fields(f)
    chat = chat or ChatDefaults()
    tools = parse_tools(f, template.source, chat.tool_format)
    text, reasoning = render_chat_request(f, template, tools, chat)
    think_open = reasoning.start == THINK and reasoning.harmony is None   # the prompt left <think> open
    grammar = _chat_grammar(f, tools, grammars, defaults.fields, chat.pure_content, think_open)
    ids = encode(tokenizer, text, True, True)
    want, n_top = _chat_logprobs(f)
    n = n_choices(f, n_parallel, "n")
    budget = chat_budget(f, tokenizer, defaults, *_budget_block(template, reasoning))
    jobs = expand([_job(f, ids, tokenizer, defaults, n_top if want else 0, want, grammar, budget)], n)
    return OpenAIJob(jobs, f.str("model", default_model) or default_model, [prompt_text(tokenizer, ids)] * n,
                     tools if tools.active and not chat.pure_content else None, reasoning)
