"""llama-server's flags over what a GGUF file says of itself: the rope scaling (`--rope-scaling`,
`--rope-scale`, `--rope-freq-base`, `--rope-freq-scale`, `--yarn-*`; model/rope_scaling.py) and
any metadata value (`--override-kv`; model/metadata_overrides.py), and what the forward adds to
it (`--control-vector*`; model/control_vector.py). Shared by `serve` and `generate`;
`RopeFlags.from_args` and `metadata_overrides.from_args` read what they parse.

The usual reason to reach for them is Qwen's model cards, which stretch a 32k model to 128k:
`--rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 32768`. As in llama.cpp, `--rope-scale N` is
`--rope-freq-scale 1/N` (the later of the two wins), and a custom YaRN factor makes the training
context the one it stretches to (what `-c 0` then takes).
"""

from __future__ import annotations

import argparse

from slotserver.model.rope_scaling import FLAG_TYPES


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def _inverse(text: str) -> float:
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--rope-scale must be positive, got {text!r}")
    return 1.0 / value


def add_model_meta_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("the model file's rope and metadata, overridden (llama-server's flags)")
    a = g.add_argument
    a("--rope-scaling", dest="rope_scaling", choices=FLAG_TYPES, default=None,
      help="RoPE frequency scaling method (default: the model's own; linear where it names a factor only)")
    a("--rope-scale", dest="rope_freq_scale", type=_inverse, default=None, metavar="N",
      help="RoPE context scaling factor: expands the context by N (--rope-freq-scale 1/N)")
    a("--rope-freq-base", type=_number, default=None, metavar="N", help="RoPE base frequency (default: the model's)")
    a("--rope-freq-scale", dest="rope_freq_scale", type=_number, default=None, metavar="N",
      help="RoPE frequency scaling factor: expands the context by 1/N (default: the model's)")
    a("--yarn-orig-ctx", type=int, default=None, metavar="N",
      help="YaRN: the model's original context size (default: the model's, else its training context)")
    a("--yarn-ext-factor", type=_number, default=None, metavar="N",
      help="YaRN: extrapolation mix factor (default: 1 with yarn scaling; 0.0 = full interpolation)")
    a("--yarn-attn-factor", type=_number, default=None, metavar="N",
      help="YaRN: attention magnitude (used where the extrapolation mix is 0; else computed, as llama.cpp)")
    a("--yarn-beta-slow", type=_number, default=None, metavar="N", help="YaRN: high correction dim or alpha")
    a("--yarn-beta-fast", type=_number, default=None, metavar="N", help="YaRN: low correction dim or beta")
    a("--control-vector", dest="control_items", action="append", default=[], type=lambda v: ("", v),
      metavar="FNAME", help="add a control vector (a GGUF of direction.N tensors; comma-separated or repeated: summed)")
    a("--control-vector-scaled", dest="control_items", action="append", type=lambda v: (":", v),
      metavar="FNAME:SCALE,...", help="add a control vector scaled by SCALE (comma-separated or repeated)")
    a("--control-vector-layer-range", dest="control_layers", nargs=2, type=int, default=None,
      metavar=("START", "END"), help="the layers control vectors apply to (default: all)")
    a("--override-kv", dest="override_kv", action="append", default=[], metavar="KEY=TYPE:VALUE,...",
      help="override a model metadata value (types int, float, bool, str; comma-separated, repeatable), e.g. "
           "tokenizer.ggml.add_bos_token=bool:false")
