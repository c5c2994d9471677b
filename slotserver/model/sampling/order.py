"""The `samplers` request field: which samplers run, in which order, as llama-server parses it.

llama-server takes either a JSON array of names (canonical, kebab-case, without underscores, or the
aliases nucleus/temp/typ; case-insensitive) or one string of letters (common/sampling.cpp,
common_sampler_types_from_names / _from_chars). It skips names it does not know with a warning; we
refuse them with an error naming them, so a typo is not silently a different chain. `infill` is
model/sampling/infill.py (the sampler chain gets the vocabulary it reads from the engine).
Torch-free: request parsing imports it.
"""

from __future__ import annotations

# llama-server's default chain (common/common.h, common_params_sampling::samplers)
DEFAULT_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")

_LETTERS = {
    "d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "s": "top_n_sigma", "m": "min_p",
    "t": "temperature", "x": "xtc", "i": "infill", "e": "penalties", "a": "adaptive_p",
}
_CANONICAL = frozenset(_LETTERS.values())


def _aliases() -> dict[str, str]:
    """name -> canonical: each canonical name, its kebab-case and no-underscore forms, and the misc aliases."""
    table = {"nucleus": "top_p", "temp": "temperature", "typ": "typ_p"}
    for name in _CANONICAL:
        table.update({name: name, name.replace("_", "-"): name, name.replace("_", ""): name})
    return table


class SamplersError(ValueError):
    """The `samplers` value names samplers that do not exist or are not supported."""


def parse_samplers(value: object) -> tuple[str, ...]:
    """A string of letters, or a list of names -> canonical names in order (repeats kept, as in llama.cpp)."""
    if isinstance(value, str):
        names = [_LETTERS.get(c, "") for c in value]
        unknown = [c for c, n in zip(value, names) if not n]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        table = _aliases()
        names = [table.get(v.lower(), "") for v in value]
        unknown = [v for v, n in zip(value, names) if not n]
    else:
        raise SamplersError(f"samplers must be a string of letters or a list of names, got {value!r}")
    if unknown:
        raise SamplersError(f"samplers: unknown sampler(s) {', '.join(map(repr, unknown))}")
    return tuple(names)
