"""The /infill prompt, token for token llama-server's `format_prompt_infill`
(tools/server/server-common.cpp), for code editors' fill-in-the-middle requests.

The layout (Qwen2.5-Coder's repo-level pattern, https://arxiv.org/pdf/2409.12186):

    [extra] [BOS] FIM_PRE prefix prompt FIM_SUF suffix FIM_MID          (--spm-infill: the
    [extra] = FIM_REP "myproject\\n" (FIM_SEP filename "\\n" text)* FIM_SEP "filename\\n"   suffix part,
                                                                         then the prefix part)
Without a FIM_REP token the repo header is left out; without FIM_SEP each extra chunk starts with
"\\n\\n--- snippet ---\\n\\n" and no closing "filename" line is written.

Budgets, as llama-server picks them (it aims the middle of the prompt at one batch):
  prefix: its LAST 3*(n_batch//4) tokens; suffix: its FIRST max(0, n_batch//4 - (2 + len(prompt)))
  tokens; extra: its LAST max(0, n_ctx - n_batch - 2*n_predict) tokens (so the repo header is the
  first thing cut), where n_predict is the server's `-n` (not the request's) and n_ctx a slot's.
Text is tokenized without BOS and without special-token parsing (a `<|fim_prefix|>` typed in the
code stays text); the `prompt` field is tokenized with special-token parsing, as llama-server does.
"""

from __future__ import annotations

from dataclasses import dataclass

from slotserver.model.text.tokenizer import Tokenizer
from slotserver.server.errors import not_supported
from slotserver.server.prompt import encode

REPO_NAME = "myproject\n"                      # llama-server's fixed project name (a TODO there)
CURRENT_FILE = "filename\n"                    # and the fixed name of the file being edited
SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"  # between extra chunks without a FIM_SEP token
DEFAULT_FILENAME = "tmp"                       # an extra chunk without "filename"


@dataclass(frozen=True)
class FimTokens:
    """A vocabulary's FIM token ids: pre/suf/mid are required, rep/sep optional (None)."""

    pre: int
    suf: int
    mid: int
    rep: int | None = None
    sep: int | None = None

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> FimTokens:
        """The ids llama.cpp settled on at load (GGUF `tokenizer.ggml.fim_*_token_id`, else found by
        token text: special_tokens.py); a model lacking pre, suf or mid is llama-server's 501."""
        ids = getattr(tokenizer, "special_ids", {})
        missing = "".join(f"{what} token is missing. " for what, key in
                          (("prefix", "fim_pre_token_id"), ("suffix", "fim_suf_token_id"),
                           ("middle", "fim_mid_token_id")) if key not in ids)
        if missing:
            raise not_supported(f"Infill is not supported by this model: {missing}")
        return cls(ids["fim_pre_token_id"], ids["fim_suf_token_id"], ids["fim_mid_token_id"],
                   ids.get("fim_rep_token_id"), ids.get("fim_sep_token_id"))


@dataclass(frozen=True)
class InfillBudget:
    """The server settings the layout depends on: `-b` (n_batch), `-n` (n_predict), a slot's
    context, and `--spm-infill` (suffix part before the prefix part)."""

    n_batch: int
    n_predict: int
    n_ctx: int
    spm: bool = False


@dataclass(frozen=True)
class InfillInput:
    """A validated request: prefix and suffix as token ids (already tokenized: they may be given as
    mixed strings and ids), extra chunks as (filename, text), the prompt as token ids."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    extra: tuple[tuple[str, str], ...] = ()
    prompt: tuple[int, ...] = ()


def plain(tokenizer: Tokenizer, text: str) -> list[int]:
    """`common_tokenize(vocab, text, false, false)`: no BOS, special-token text stays text."""
    return encode(tokenizer, text, False, False)


def extra_tokens(tokenizer: Tokenizer, fim: FimTokens, extra: tuple[tuple[str, str], ...]) -> list[int]:
    """The repo-level context before the FIM prefix, whole (the budget cuts it afterwards)."""
    out: list[int] = []
    if fim.rep is not None:
        out += [fim.rep, *plain(tokenizer, REPO_NAME)]
    for filename, text in extra:
        if fim.sep is not None:
            out += [fim.sep, *plain(tokenizer, filename + "\n")]
        else:
            out += plain(tokenizer, SNIPPET_SEPARATOR)
        out += plain(tokenizer, text)
    if fim.sep is not None:
        out += [fim.sep, *plain(tokenizer, CURRENT_FILE)]
    return out


def format_infill(tokenizer: Tokenizer, fim: FimTokens, request: InfillInput, budget: InfillBudget) -> list[int]:
    """The prompt's token ids (see the module docstring for the layout and the budgets)."""
    quarter = budget.n_batch // 4
    n_prefix = min(len(request.prefix), 3 * quarter)
    n_suffix = min(len(request.suffix), max(0, quarter - (2 + len(request.prompt))))
    extra = extra_tokens(tokenizer, fim, request.extra)
    n_extra = min(max(0, budget.n_ctx - budget.n_batch - 2 * budget.n_predict), len(extra))
    prefix_part = [fim.pre, *request.prefix[len(request.prefix) - n_prefix:], *request.prompt]
    suffix_part = [fim.suf, *request.suffix[:n_suffix]]
    first, last = (suffix_part, prefix_part) if budget.spm else (prefix_part, suffix_part)
    bos = [tokenizer.bos_id] if tokenizer.add_bos and tokenizer.bos_id is not None else []
    return [*extra[len(extra) - n_extra:], *bos, *first, *last, fim.mid]
