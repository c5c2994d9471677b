"""Constrained decoding with llguidance: grammars in, per-sequence matchers, token masks out.

A request's constraint (`grammar` GBNF or Lark, `json_schema`, OpenAI's `response_format`, a
forced tool call) is compiled once by the server into llguidance's grammar text
(`compile_constraint`, in a worker thread) and checked against the model's vocabulary
(`Grammars.check`): every problem is a `GrammarError` naming it, i.e. a 400, before the request
reaches the engine. llguidance bounds its own work (`LLParserLimits`), so a hostile grammar is an
error, never a hang.

The engine owns one `Grammars` per model: llguidance's view of the vocabulary (built once, lazily,
from slotserver's Tokenizer: every token's bytes, control tokens marked with a 0xff prefix so no
grammar text can produce them, the end-of-generation ids) and the executor that fills the batch's
masks in parallel threads (`masks.py`).

JSON output is compact with llama.cpp's separators (", " and ": ") and no free whitespace: a
grammar that allows any run of whitespace lets a small model emit newlines until `n_predict`.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import llguidance as llg

from slotserver.errors import RequestError
from slotserver.model.text.tokenizer import Tokenizer

JSON_OPTIONS = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}
CONTROL_PREFIX = b"\xff"   # llguidance's marker for special tokens (never matched by grammar text)


class GrammarError(RequestError):
    """An invalid grammar or schema: the message names the problem (an HTTP 400)."""


def _schema_grammar(schema: Any) -> str:
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise GrammarError(f"a JSON schema must be an object, got {type(schema).__name__}")
    try:
        return llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_OPTIONS)
    except (ValueError, TypeError) as e:
        raise GrammarError(f"invalid JSON schema: {e}") from None


def validated_constraint(kind: str, source: Any) -> str:
    """compile_constraint, then llguidance's checks that need no vocabulary (a JSON schema's `type`,
    a grammar's rules): what start-up can say of a server's own --grammar / --json-schema."""
    grammar = compile_constraint(kind, source)
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, None)
    if is_error:
        raise GrammarError(f"invalid {'JSON schema' if kind == 'json_schema' else 'grammar'}: "
                           f"{messages[0] if messages else 'rejected by llguidance'}")
    return grammar


def compile_constraint(kind: str, source: Any) -> str:
    """`kind` "gbnf" (llama.cpp's GBNF or Lark), "json_schema", "regex" or "lark" -> llguidance's
    grammar text. Raises GrammarError; validity against a vocabulary is `Grammars.check`'s job."""
    if kind == "json_schema":
        return _schema_grammar(source)
    if not isinstance(source, str) or not source.strip():
        raise GrammarError(f"a {kind} grammar must be a non-empty string")
    try:
        return llg.grammar_from("gbnf" if kind == "gbnf" else kind, source)
    except (ValueError, TypeError, RuntimeError) as e:
        raise GrammarError(f"invalid grammar: {e}") from None


def _token_bytes(tokenizer: Tokenizer) -> list[bytes]:
    """Each token's bytes as llguidance wants them; control tokens (their text differs between
    special=True and False: hidden in plain text) get the 0xff prefix."""
    out = []
    for i in range(tokenizer.vocab_size):
        plain, special = tokenizer.token_bytes(i, special=False), tokenizer.token_bytes(i, special=True)
        out.append(CONTROL_PREFIX + special if plain != special else plain)
    return out


class _Vocab:
    """The duck-typed tokenizer `llguidance.TokenizerWrapper` reads."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokens = _token_bytes(tokenizer)
        self.eos_token_id = tokenizer.eos_id if tokenizer.eos_id is not None else min(tokenizer.eog_ids)
        self.bos_token_id = tokenizer.bos_id
        self.special_token_ids = [i for i, t in enumerate(self.tokens) if t.startswith(CONTROL_PREFIX)]
        self._tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        if isinstance(text, bytes):
            raise TypeError("text, not bytes")    # TokenizerWrapper probes for bytes input once
        return self._tokenizer.encode(text, add_special=False, parse_special=False)


class Grammars:
    """One model's llguidance vocabulary and mask executor; makes matchers. Thread-safe."""

    def __init__(self, tokenizer: Tokenizer, threads: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self._threads = threads
        self._lock = threading.Lock()
        self._ll: llg.LLTokenizer | None = None
        self._executor: llg.LLExecutor | None = None

    @property
    def ll_tokenizer(self) -> llg.LLTokenizer:
        """Built on first use (tens of ms for a 50k vocabulary), then shared."""
        with self._lock:
            if self._ll is None:
                eog = sorted(self.tokenizer.eog_ids) or None
                self._ll = llg.LLTokenizer(llg.TokenizerWrapper(_Vocab(self.tokenizer)),
                                           n_vocab=self.vocab_size, eos_token=eog)
            return self._ll

    @property
    def executor(self) -> llg.LLExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = llg.LLExecutor(self._threads)
            return self._executor

    def check(self, grammar: str) -> None:
        """Raise GrammarError unless `grammar` compiles against this vocabulary."""
        is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, self.ll_tokenizer)
        if is_error:
            raise GrammarError(f"invalid grammar: {messages[0] if messages else 'rejected by llguidance'}")

    def matcher(self, grammar: str) -> llg.LLMatcher:
        m = llg.LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        if m.is_error():
            raise GrammarError(f"invalid grammar: {m.get_error()}")
        return m
