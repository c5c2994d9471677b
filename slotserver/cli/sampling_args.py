"""llama-server's sampling flags: the server's defaults for every request that does not set a field.

`llama-server -m qwen.gguf --temp 0.7 --top-p 0.8 --top-k 20 --min-p 0 --repeat-penalty 1.05` is how
model cards tell users to serve a model; the same command line works here. Each flag sets the
default of one request field, by its request name (`--top-k` -> `top_k`), for /completion and the
OpenAI, Anthropic and Responses routes alike; a field the request sends wins, as in llama-server
(a request's `logit_bias`, `samplers` or breakers replace the flag's, they are not merged).
`--temp`, `--seed` and `-n` stay in GenerationDefaults' own fields.

Values are checked here, at start-up, within the request parser's bounds (REQUEST_BOUNDS, one table
for both; one line, exit status 2; grammars and schemas compiled), and again per request by the
request parser (server/params.py), which reads them like any body field. Two things only the
loaded model can check: a grammar's tokens against its vocabulary (per request, as a request's own
grammar), and `-l` token ids past the vocabulary, which are skipped, as llama-server skips them
(server/params.py).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any, Callable

from slotserver.model.sampling.order import SamplersError, parse_samplers
from slotserver.model.sampling.params import ADDITIVE_LIMIT, REQUEST_BOUNDS

Check = Callable[[str], Any]


def _number(kind: type, lo: float, hi: float) -> Check:
    def check(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}")
        if not (math.isfinite(value) and lo <= value <= hi):
            raise argparse.ArgumentTypeError(f"must be in [{lo:g}, {hi:g}], got {text}")
        return value
    return check


def _logit_bias(text: str) -> list:
    """llama-server's TOKEN_ID(+/-)BIAS: `15043+1`, `15043-inf` (forbidden: the request's `false`),
    within the request parser's +-ADDITIVE_LIMIT."""
    for sign in "+-":
        head, found, tail = text.partition(sign)
        if found and head.strip().isdigit():
            try:
                bias = float(tail) * (-1 if sign == "-" else 1)
            except ValueError:
                break
            if bias == -math.inf:
                return [int(head), False]
            if abs(bias) <= ADDITIVE_LIMIT:
                return [int(head), bias]
    raise argparse.ArgumentTypeError(f"expected TOKEN_ID(+/-)BIAS with a bias in [-1e6, 1e6] or -inf, such as "
                                     f"15043+1 or 15043-inf, got {text!r}")


def _samplers(separator: str | None) -> Check:
    def check(text: str):
        value = text.split(separator) if separator else text
        try:
            parse_samplers(value)
        except SamplersError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return value
    return check


def _json_schema(text: str) -> Any:
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(schema, (dict, bool)):
        raise argparse.ArgumentTypeError("a JSON Schema is an object")
    return schema


def _compiled(kind: str) -> Check:
    """The constraint, compiled once here so that a bad one stops start-up, not every request."""
    def check(source):
        from slotserver.engine.grammar import GrammarError, validated_constraint   # llguidance: only when given
        try:
            validated_constraint(kind, source)
        except GrammarError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return source
    return check


def _chain(*checks: Check) -> Check:
    def check(text: str):
        for one in checks:
            text = one(text)
        return text
    return check


def _file(check: Check | None = None) -> Check:
    def read(path: str):
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise argparse.ArgumentTypeError(f"{path}: {getattr(e, 'strerror', None) or e}") from None
        return check(text) if check else text
    return read


# (flags, request field, its type: int or float (checked within REQUEST_BOUNDS[field]), another
# check, or None for a switch; help)
FLAGS: tuple[tuple[tuple[str, ...], str, type | Check | None, str], ...] = (
    (("--top-k",), "top_k", int, "top-k (default 40, 0: off)"),
    (("--top-p",), "top_p", float, "top-p (default 0.95, 1: off)"),
    (("--min-p",), "min_p", float, "min-p (default 0.05, 0: off)"),
    (("--top-nsigma", "--top-n-sigma"), "top_n_sigma", float, "top-n-sigma (default -1: off)"),
    (("--xtc-probability",), "xtc_probability", float, "XTC probability (default 0: off)"),
    (("--xtc-threshold",), "xtc_threshold", float, "XTC threshold (default 0.1)"),
    (("--typical", "--typical-p"), "typical_p", float, "locally typical sampling p (default 1: off)"),
    (("--repeat-last-n",), "repeat_last_n", int, "tokens the penalties look back (default 64, -1: context)"),
    (("--repeat-penalty",), "repeat_penalty", float, "repeat penalty (default 1: off)"),
    (("--presence-penalty",), "presence_penalty", float, "presence penalty (default 0: off)"),
    (("--frequency-penalty",), "frequency_penalty", float, "frequency penalty (default 0: off)"),
    (("--dry-multiplier",), "dry_multiplier", float, "DRY multiplier (default 0: off)"),
    (("--dry-base",), "dry_base", float, "DRY base (default 1.75)"),
    (("--dry-allowed-length",), "dry_allowed_length", int, "DRY allowed length (default 2)"),
    (("--dry-penalty-last-n",), "dry_penalty_last_n", int, "DRY look-back (default 64)"),
    (("--adaptive-target",), "adaptive_target", float, "adaptive-p target (default -1: off)"),
    (("--adaptive-decay",), "adaptive_decay", float, "adaptive-p decay (default 0.9)"),
    (("--dynatemp-range",), "dynatemp_range", float, "dynamic temperature range (default 0: off)"),
    (("--dynatemp-exp",), "dynatemp_exponent", float, "dynamic temperature exponent (default 1)"),
    (("--mirostat",), "mirostat", int, "mirostat 1 or 2 (default 0: off)"),
    (("--mirostat-lr",), "mirostat_eta", float, "mirostat learning rate eta (default 0.1)"),
    (("--mirostat-ent",), "mirostat_tau", float, "mirostat target entropy tau (default 5)"),
    (("--samplers",), "samplers", _samplers(";"), "sampler names in order, ';'-separated"),
    (("--sampler-seq", "--sampling-seq"), "samplers", _samplers(None), "sampler letters in order (edkypmxt)"),
    (("--ignore-eos",), "ignore_eos", None, "generate past end-of-generation tokens"),
    (("--keep",), "n_keep", int, "prompt tokens kept by a context shift (-1: all)"),
    (("--grammar",), "grammar", _compiled("gbnf"), "a GBNF grammar every answer follows"),
    (("--grammar-file",), "grammar", _file(_compiled("gbnf")), "a file holding that grammar"),
    (("-j", "--json-schema"), "json_schema", _chain(_json_schema, _compiled("json_schema")),
     "a JSON Schema every answer follows"),
    (("-jf", "--json-schema-file"), "json_schema", _file(_chain(_json_schema, _compiled("json_schema"))),
     "a file holding that schema"),
)


class _Field(argparse.Action):
    """Stores the flag's value under its request field in `namespace.request_fields` (a dict made
    per parse): server/config_from_args.py passes that dict on to GenerationDefaults.fields (the
    server layer does not import the command line's)."""

    def __init__(self, option_strings, dest, field: str, append: bool = False, **kw) -> None:
        self.field, self.append = field, append
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        fields = dict(getattr(namespace, "request_fields", None) or {})
        if self.nargs == 0:
            value = True
        if self.append:   # `--dry-sequence-breaker none`: no breakers (so far), as llama-server
            clear = value == "none" and self.field == "dry_sequence_breakers"
            value = [] if clear else [*fields.get(self.field, []), value]
        fields[self.field] = value
        namespace.request_fields = fields


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("request defaults (llama-server's sampling flags; a request's own field wins)")
    for flags, field, check, text in FLAGS:
        if check is None:
            g.add_argument(*flags, action=_Field, field=field, nargs=0, help=text)
        else:
            check = _number(check, *REQUEST_BOUNDS[field]) if check in (int, float) else check
            g.add_argument(*flags, action=_Field, field=field, type=check, metavar="V", help=text)
    g.add_argument("--dry-sequence-breaker", action=_Field, field="dry_sequence_breakers", append=True,
                   metavar="STRING",
                   help="a DRY sequence breaker (repeatable; replaces the defaults; none: no breakers)")
    g.add_argument("-r", "--reverse-prompt", action=_Field, field="stop", append=True, metavar="PROMPT",
                   help="stop at PROMPT (repeatable): every request's `stop` unless it sends its own")
    g.add_argument("-l", "--logit-bias", action=_Field, field="logit_bias", append=True, type=_logit_bias,
                   metavar="TOKEN_ID(+/-)BIAS", help="bias a token's logit (repeatable): 15043+1, 15043-inf")
    p.set_defaults(request_fields=None)
