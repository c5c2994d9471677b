"""DRY ("Don't Repeat Yourself"), ported from llama.cpp's src/llama-sampler.cpp (itself from Koboldcpp).

A token that would extend a sequence already seen in the last `dry_penalty_last_n` tokens by more
than `dry_allowed_length` loses `multiplier * base ** (repeat_len - allowed_length)` from its logit.
Sequence breakers (strings such as "\\n") cut the repetition length: a repeat may not reach back past
the most recent breaker, and a token that is itself a whole breaker is never penalised.

Breakers are strings; llama.cpp turns each into (head token, tail tokens) pairs once per request
by scanning the vocabulary for tokens that contain it, or end with a prefix of it (the tail is then
the tokenization of the rest). `process_breakers` does that with the tokenizer; the sampler only
sees the pairs. Pure Python and torch-free: it runs once per DRY row per step on <= last_n tokens.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Protocol

MAX_BREAKER_BYTES = 40  # llama.cpp's MAX_CHAR_LEN
MAX_TAIL_TOKENS = 20  # llama.cpp's MAX_SEQ_LEN
FLOAT_MAX_LOG = 88.7228391  # log(FLT_MAX): the exponent is clamped so base**exp stays finite

Breakers = tuple[tuple[int, tuple[int, ...]], ...]


class _Tokenizer(Protocol):
    vocab_size: int

    def token_bytes(self, id: int, special: bool = False) -> bytes: ...
    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]: ...


def process_breakers(tokenizer: _Tokenizer, breakers: Iterable[str]) -> Breakers:
    """llama.cpp's get_overlapping_token_sequences for each breaker, on the tokens' bytes."""
    found: dict[int, set[tuple[int, ...]]] = {}
    pieces = [tokenizer.token_bytes(i, special=True) for i in range(tokenizer.vocab_size)]
    for breaker in breakers:
        text = breaker.encode()[:MAX_BREAKER_BYTES]
        if not text:
            continue  # llama.cpp skips empty breakers
        tails: dict[int, tuple[int, ...]] = {}  # prefix length -> tokenization of the rest
        for token, word in enumerate(pieces):
            if text in word:
                found.setdefault(token, set()).add(())
                continue
            for n in range(1, min(len(text), len(word) + 1)):  # word ends with text[:n]
                if word.endswith(text[:n]):
                    if n not in tails:
                        rest = text[n:].decode("utf-8", "replace")
                        tails[n] = tuple(tokenizer.encode(rest, add_special=False)[:MAX_TAIL_TOKENS])
                    found.setdefault(token, set()).add(tails[n])
    return tuple((head, tail) for head in sorted(found) for tail in sorted(found[head]))


def _rep_limit(window: Sequence[int], breakers: dict[int, list[tuple[int, ...]]]) -> int:
    """How far back a repeat may reach: up to the most recent complete breaker (Step 1)."""
    n = len(window)
    rat = lambda i: window[n - 1 - i]  # noqa: E731 - llama.cpp's ring_buffer.rat: i-th from the end
    for i in range(n):
        longest = -1
        for tail in breakers.get(rat(i), ()):
            if longest < len(tail) <= i and all(tail[o] == rat(i - o - 1) for o in range(len(tail))):
                longest = len(tail)
        if longest >= 0:
            return i - longest
    return n


def _repeat_counts(window: Sequence[int], rep_limit: int) -> list[int]:
    """count[j]: how many tokens ending at window[j] equal the window's last tokens, at most
    rep_limit (Step 2, the reversed Z-algorithm, linear in the window)."""
    n = len(window)
    rat = lambda i: window[n - 1 - i]  # noqa: E731
    count, last, lt, rt = [0] * n, n - 1, 0, 0
    for k in range(1, n):
        if k > rt:
            m = 0
            while m + k < n and rat(m) == rat(m + k):
                m += 1
            count[last - k] = min(m, rep_limit)
            if m > 0:
                lt, rt = k, k + m - 1
        else:
            p, right = k - lt, rt - k + 1
            if count[last - p] < right:
                count[last - k] = min(count[last - p], rep_limit)
            else:
                i = rt + 1
                while i < n and rat(i) == rat(i - k):
                    i += 1
                count[last - k] = min(i - k, rep_limit)
                lt, rt = k, i - 1
    return count


def dry_penalties(history: Sequence[int], multiplier: float, base: float, allowed_length: int,
                  last_n: int, breakers: Breakers) -> dict[int, float]:
    """token -> the amount DRY subtracts from its logit, given the row's history (prompt + generated)."""
    if multiplier == 0 or base < 1 or last_n == 0:
        return {}
    window = history[-last_n:] if last_n > 0 else history
    if len(window) <= allowed_length:
        return {}
    table: dict[int, list[tuple[int, ...]]] = {}
    for head, tail in breakers:
        table.setdefault(head, []).append(tail)
    rep_limit = _rep_limit(window, table)
    if rep_limit < allowed_length:
        return {}
    longest: dict[int, int] = {}  # token that would extend a repeat -> the longest such repeat (Step 3)
    for i, repeat_len in enumerate(_repeat_counts(window, rep_limit)[:-1]):
        if repeat_len >= allowed_length:
            token = window[i + 1]
            longest[token] = max(longest.get(token, 0), repeat_len)
    max_exp = int(FLOAT_MAX_LOG / math.log(base)) if base > 1.000001 else 0
    out = {}
    for token, repeat_len in longest.items():  # Step 4; a whole single-token breaker is exempt
        if () in table.get(token, ()):
            continue
        exp = repeat_len - allowed_length
        exp = max_exp if 0 < max_exp < exp else exp
        out[token] = multiplier * base**exp
    return out
