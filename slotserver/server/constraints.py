"""A request's output constraint: `grammar`, `json_schema` or OpenAI's `response_format`.

Accepted on every completion endpoint (/completion, /v1/completions, /v1/chat/completions), with
llama-server's meaning:
- `grammar`: a GBNF grammar (llama.cpp's grammars/README.md; Lark also parses), converted by
  llguidance's own GBNF converter;
- `json_schema`: a JSON Schema object; the output is JSON that validates against it;
- `response_format`: `{"type": "text"}` (no constraint), `{"type": "json_object"}` (any JSON
  object, or the schema given as its `schema` key, as llama-server reads it), or
  `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`. The schema is always
  enforced, `strict` true or false (false only allows it in OpenAI; enforcing it is a subset).
At most one of the three may constrain a request (400 otherwise, as llama-server says "either
json_schema or grammar"). Every problem is a 400 naming it; the grammar text that reaches the
engine has been compiled and checked against the model's vocabulary.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slotserver.engine.grammar import GrammarError, Grammars, compile_constraint
from slotserver.server.errors import bad_request
from slotserver.server.fields import Fields

ANY_OBJECT = {"type": "object"}


def _response_format(fmt: dict) -> dict | None:
    """OpenAI's response_format -> a JSON schema, or None for plain text."""
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = fmt.get("schema", ANY_OBJECT)
        return schema if schema is not None else ANY_OBJECT
    if kind == "json_schema":
        wrapper = fmt.get("json_schema")
        if not isinstance(wrapper, dict):
            raise bad_request("'response_format.json_schema' must be an object {name, schema, strict}")
        strict = wrapper.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise bad_request("'response_format.json_schema.strict' must be true or false")
        schema = wrapper.get("schema", ANY_OBJECT)
        if not isinstance(schema, (dict, bool)):
            raise bad_request("'response_format.json_schema.schema' must be a JSON Schema object")
        return schema
    raise bad_request(f"'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got {kind!r}")


def requested(f: Fields) -> tuple[str, str, Any] | None:
    """(field name, kind, source) of the request's constraint, or None."""
    found = []
    if f.has("grammar"):
        found.append(("grammar", "gbnf", f.str("grammar")))
    if f.has("json_schema"):
        schema = f.raw("json_schema")
        if not isinstance(schema, (dict, bool)):
            raise bad_request("'json_schema' must be a JSON Schema object")
        found.append(("json_schema", "json_schema", schema))
    fmt = f.obj("response_format")
    if fmt is not None:
        schema = _response_format(fmt)
        if schema is not None:
            found.append(("response_format", "json_schema", schema))
    if len(found) > 1:
        raise bad_request(f"either 'grammar', 'json_schema' or 'response_format' may constrain the output, "
                          f"not several (got {', '.join(n for n, _, _ in found)})")
    return found[0] if found else None


def compile_checked(field: str, kind: str, source: Any, grammars: Grammars | None) -> str:
    """llguidance grammar text for the constraint; 400 naming `field` on any problem."""
    try:
        grammar = compile_constraint(kind, source)
        if grammars is not None:
            grammars.check(grammar)
    except GrammarError as e:
        raise bad_request(f"'{field}': {e}") from None
    return grammar


def default_constraint(fallback: Mapping[str, Any] | None) -> tuple[str, str, Any] | None:
    """The server's own constraint (--grammar, --json-schema; cli/sampling_args.py), for a request
    that sets none."""
    if fallback and fallback.get("grammar") is not None:
        return "--grammar", "gbnf", fallback["grammar"]
    if fallback and fallback.get("json_schema") is not None:
        return "--json-schema", "json_schema", fallback["json_schema"]
    return None


def parse_constraint(f: Fields, grammars: Grammars | None, fallback: Mapping[str, Any] | None = None) -> str | None:
    """The compiled grammar of a request body (else the server's), or None when the output is free."""
    found = requested(f) or default_constraint(fallback)
    return compile_checked(*found, grammars) if found else None
