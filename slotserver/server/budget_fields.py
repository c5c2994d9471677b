"""llama-server's reasoning budget fields -> the engine's `BudgetSpec` (engine/reasoning_budget.py).

The fields, as llama-server reads them (server-schema.cpp, and server-common.cpp
`oaicompat_chat_params_parse` for the chat routes):
- `reasoning_budget_tokens`: -1 unlimited, N >= 0 at most N tokens inside the reasoning block,
  then `reasoning_budget_message` and the end tag are forced (0: the end is forced at once).
  Default: `--reasoning-budget`. On the chat routes -1 also means that default, and
  `thinking_budget_tokens` is its alias (`reasoning_budget_tokens` wins when both are given).
- `reasoning_budget_message`: text forced before the end tag (default `--reasoning-budget-message`).
- `reasoning_budget_start_tag`, `reasoning_budget_end_tags` (a list; or one string as
  `reasoning_budget_end_tag`): the block's tags, tokenized with special tokens parsed; the first
  end tag is the one forced, any of them ends the block. Empty tags are dropped.

Chat routes: a template with a reasoning block (it writes `<think>`, reasoning.py; or gpt-oss's
harmony, whose analysis message is the block: `<|channel|>analysis<|message|>` ... `<|end|>`, as
llama.cpp's GPT-OSS handler declares) brings its own tags over the request's, as
llama-server's chat parser does; when its prompt already opened the block the budget counts from
the first generated token. A template without one takes the request's tags, if any. With no tags
there is nothing to count and the budget has no effect (llama-server alike).

/completion, /v1/completions and /infill: the request's tags only; a `reasoning_budget_tokens` of
its own without both tags is a 400 (llama-server would silently do nothing), and
`thinking_budget_tokens`, which llama-server does not read there, is a 400 when set.

One difference: llama-server forces nothing when the budget runs out on /completion unless the
request sends `reasoning_budget_message` (its forced sequence is built when that field is read);
here the first end tag is forced, after the message if any, on every route.
"""

from __future__ import annotations

from slotserver.engine.reasoning_budget import BudgetSpec
from slotserver.model.text.tokenizer import Tokenizer
from slotserver.server.config import GenerationDefaults
from slotserver.server.errors import bad_request
from slotserver.server.fields import INT32_MAX, Fields
from slotserver.server.reasoning import CLOSE, OPEN

TOKENS, ALIAS = "reasoning_budget_tokens", "thinking_budget_tokens"


def _tags(f: Fields) -> tuple[str, tuple[str, ...]]:
    """(start tag, end tags) the request names; "" / () when it names none."""
    start = f.str("reasoning_budget_start_tag", "")
    ends = f.raw("reasoning_budget_end_tags")
    if ends is None:
        ends = [f.str("reasoning_budget_end_tag", "")]
    elif not isinstance(ends, list) or not all(isinstance(e, str) for e in ends):
        raise bad_request("'reasoning_budget_end_tags' must be a list of strings")
    return start, tuple(e for e in ends if e)


def _spec(tokenizer: Tokenizer, budget: int, start: str, ends: tuple[str, ...], message: str,
          opened: bool) -> BudgetSpec | None:
    """The token sequences, tokenized as llama.cpp does (no BOS, special tokens parsed); None for
    an unlimited budget or a missing tag."""
    if budget < 0 or not start or not ends:
        return None

    def ids(text: str) -> tuple[int, ...]:
        return tuple(tokenizer.encode(text, add_special=False, parse_special=True))

    end_ids = tuple(ids(e) for e in ends)
    forced = (ids(message) if message else ()) + end_ids[0]
    return BudgetSpec(budget, (ids(start),), end_ids, forced, opened)


def _message(f: Fields, defaults: GenerationDefaults) -> str:
    return f.str("reasoning_budget_message", defaults.reasoning_budget_message)


def completion_budget(f: Fields, tokenizer: Tokenizer, defaults: GenerationDefaults) -> BudgetSpec | None:
    """/completion, /v1/completions, /infill: the budget with the request's own tags."""
    budget = f.int(TOKENS, defaults.reasoning_budget, lo=-1, hi=INT32_MAX)
    if f.int(ALIAS, -1, lo=-1, hi=INT32_MAX) != -1:
        raise bad_request(f"'{ALIAS}' is read on the chat routes only; here use '{TOKENS}' with "
                          "'reasoning_budget_start_tag' and 'reasoning_budget_end_tags'")
    start, ends = _tags(f)
    message = _message(f, defaults)
    if f.has(TOKENS) and budget >= 0 and not (start and ends):
        raise bad_request(f"'{TOKENS}' needs 'reasoning_budget_start_tag' and 'reasoning_budget_end_tags' "
                          "on this route (the chat routes take the tags from the chat template)")
    return _spec(tokenizer, budget, start, ends, message, opened=False)


def chat_budget(f: Fields, tokenizer: Tokenizer, defaults: GenerationDefaults,
                template_tags: tuple[str, tuple[str, ...]] | None, opened: bool) -> BudgetSpec | None:
    """The chat routes: `template_tags`, the (start, end tags) of the template's reasoning block
    (`<think>`, or harmony's analysis message), used over the request's; `opened`, the prompt ends
    inside it (counting starts with the first generated token)."""
    own = f.int(ALIAS, -1, lo=-1, hi=INT32_MAX)
    if f.has(TOKENS):
        own = f.int(TOKENS, -1, lo=-1, hi=INT32_MAX)
    budget = defaults.reasoning_budget if own == -1 else own
    start, ends = _tags(f)   # validated either way
    if template_tags is not None:
        start, ends = template_tags
    return _spec(tokenizer, budget, start, ends, _message(f, defaults), opened=template_tags is not None and opened)


THINK_TAGS = (OPEN, (CLOSE,))
