"""The table of llama.cpp's byte-level BPE pre-tokenizers, keyed by `tokenizer.ggml.pre`.

Each name maps to the regexes llama.cpp applies in sequence (every match isolated, as its
`unicode_regex_split` does) plus llama.cpp's per-pre-tokenizer defaults (flags below).
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
_QWEN35 = _CONTRACTIONS + (r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_UPPER_LOWER = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
_LOWER_UPPER = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_TEKKEN = _UPPER_LOWER + "|" + _LOWER_UPPER + r"|\p{N}" + _TAIL
_GPT4O = (_UPPER_LOWER + _CONTRACTIONS + "?|" + _LOWER_UPPER + _CONTRACTIONS + r"?|\p{N}{1,3}"
          + _TAIL)
_PORO = r" ?[^(\s|.,!?…。，、।۔،)]+"
_CJK = "[一-龥ࠀ-一가-퟿]+"
_DEEPSEEK3 = (r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
              r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
              r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEEPSEEK_LLM_LETTERS = (
    r"\s?["
    "A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ"
    "-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK"
    "-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-"
    "𐳲𑢠-𑣟𞤀-𞥃"
    "]+")
_DEEPSEEK_LLM = ("[\r\n]", _DEEPSEEK_LLM_LETTERS, "\\s?[!-/:-~！-／：-～‘-‟\u3000-。]+", r"\s+$",
                 _CJK, r"\p{N}+")
_SEED_CODER = _CONTRACTIONS + (r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
                               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_BAILING = (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+")

# (names, regexes, flags): llama.cpp's name groups and its per-name defaults: ignore_merges,
# add_bos, keep_spaces (clean_spaces = false: detokenize keeps " ," and " 's" as they are) and
# no_bos (no default BOS id; other byte-level vocabularies default to id 11 for BOS and EOS).
# Pre-tokenizers that need more than regexes (kimi-k2, afmoe, superbpe, gemma4's raw UTF-8 BPE,
# add_sep models) are left out, so such files are refused with the list of supported names.
_PRE_GROUPS: list[tuple[tuple[str, ...], tuple[str, ...], frozenset[str]]] = [
    (("default",), (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"), frozenset()),
    (("gpt-2", "gpt2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
      "a.x-4.0", "mellum", "modern-bert", "mpt", "olmo", "jais", "exaone4"), (_GPT2,), frozenset()),
    (("trillion", "granite-docling"), (_GPT2,), frozenset({"keep_spaces"})),
    (("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"), (r"\p{N}", _GPT2),
     frozenset()),
    (("smollm", "command-r"), (r"\p{N}", _GPT2), frozenset({"keep_spaces"})),
    (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
      "jina-v5-nano"), (_LLAMA3,), frozenset({"ignore_merges", "add_bos"})),
    (("dbrx", "smaug-bpe"), (_LLAMA3,), frozenset()),
    (("minicpm5",), (r"\p{N}{1,3}", _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}+")), frozenset({"ignore_merges"})),
    (("chatglm-bpe",), (_LLAMA3,), frozenset({"no_bos"})),
    (("glm4", "glm5"), (_LLAMA3,), frozenset({"ignore_merges", "no_bos"})),
    (("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "grok-2", "solar-open"),
     (_QWEN2,), frozenset({"keep_spaces"})),
    (("stablelm2", "megrez"), (_QWEN2,), frozenset()),
    (("qwen35",), (_QWEN35,), frozenset({"keep_spaces"})),
    (("tekken",), (_TEKKEN,), frozenset({"ignore_merges", "add_bos", "keep_spaces"})),
    (("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), (_GPT4O,),
     frozenset({"keep_spaces"})),
    (("falcon",), (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"), frozenset()),
    (("deepseek-coder",), ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"),
     frozenset({"keep_spaces"})),
    (("deepseek-llm",), _DEEPSEEK_LLM, frozenset({"keep_spaces"})),
    (("deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm"), _DEEPSEEK3,
     frozenset({"keep_spaces"})),
    (("poro-chat",), (_PORO,), frozenset({"keep_spaces"})),
    (("bloom", "gpt3-finnish"), (_PORO,), frozenset()),
    (("viking",), (_PORO, r"\p{N}"), frozenset({"keep_spaces"})),
    (("seed-coder",), (_SEED_CODER,), frozenset({"keep_spaces"})),
    (("bailingmoe", "bailingmoe2", "llada-moe"), (_BAILING,), frozenset({"keep_spaces"})),
]
PRE_RULES: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {
    name: (regexes, flags) for names, regexes, flags in _PRE_GROUPS for name in names}
SUPPORTED_PRE = frozenset(PRE_RULES)


def build_pre_tokenizer(regexes: tuple[str, ...]) -> pre_tokenizers.PreTokenizer:
    """Each llama.cpp regex becomes an isolating split; then bytes map to GPT-2 characters."""
    steps = [pre_tokenizers.Split(Regex(rx), behavior="isolated") for rx in regexes]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return pre_tokenizers.Sequence(steps)
