"""The table of llama.cpp's byte-level BPE pre-tokenizers, keyed by `tokenizer.ggml.pre`.

Each name maps to the regexes llama.cpp applies in sequence (every match isolated, as its
`unicode_regex_split` does) plus its per-pre-tokenizer defaults (`ignore_merges`, `add_bos`).
The regexes and name groups are copied from the `llm_tokenizer_bpe` constructor and
`llama_vocab::impl::load` in llama.cpp's `src/llama-vocab.cpp`. `build_pre_tokenizer` turns one
entry into a `tokenizers` pre-tokenizer; `tokenizer.py` uses it for `gpt2` models.
"""

from __future__ import annotations

from tokenizers import Regex, pre_tokenizers

__all__ = ["PRE_RULES", "SUPPORTED_PRE", "build_pre_tokenizer"]

# Regexes verbatim from llama.cpp's llm_tokenizer_bpe constructor.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = _CONTRACTIONS + (
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
_UPPER_LOWER = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
_LOWER_UPPER = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_TEKKEN = _UPPER_LOWER + "|" + _LOWER_UPPER + r"|\p{N}" + _TAIL
_GPT4O = (_UPPER_LOWER + _CONTRACTIONS + "?|" + _LOWER_UPPER + _CONTRACTIONS + r"?|\p{N}{1,3}"
          + _TAIL)
_CJK = "[一-龥ࠀ-一가-퟿]+"

# (names, regexes, flags): llama.cpp's name groups; flags are its ignore_merges/add_bos defaults.
_PRE_GROUPS: list[tuple[tuple[str, ...], tuple[str, ...], frozenset[str]]] = [
    (("default",), (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"), frozenset()),
    (("gpt-2", "gpt2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
      "a.x-4.0", "mellum", "mpt", "olmo", "jais", "trillion", "exaone4", "granite-docling"),
     (_GPT2,), frozenset()),
    (("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
     (r"\p{N}", _GPT2), frozenset()),
    (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
     (_LLAMA3,), frozenset({"ignore_merges", "add_bos"})),
    (("dbrx", "smaug-bpe"), (_LLAMA3,), frozenset()),
    (("glm4", "chatglm-bpe"), (_LLAMA3,), frozenset()),
    (("qwen2", "deepseek-r1-qwen", "kormo", "megrez", "stablelm2", "hunyuan", "grok-2"),
     (_QWEN2,), frozenset()),
    (("tekken",), (_TEKKEN,), frozenset({"ignore_merges", "add_bos"})),
    (("gpt-4o", "llama4", "minimax-m2"), (_GPT4O,), frozenset()),
    (("falcon",), (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"), frozenset()),
    (("deepseek-coder",), ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"), frozenset()),
]
PRE_RULES: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {
    name: (regexes, flags) for names, regexes, flags in _PRE_GROUPS for name in names}
SUPPORTED_PRE = frozenset(PRE_RULES)


def build_pre_tokenizer(regexes: tuple[str, ...]) -> pre_tokenizers.PreTokenizer:
    """Each llama.cpp regex becomes an isolating split; then bytes map to GPT-2 characters."""
    steps = [pre_tokenizers.Split(Regex(rx), behavior="isolated") for rx in regexes]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return pre_tokenizers.Sequence(steps)
