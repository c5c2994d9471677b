"""`slotserver serve`'s speculative decoding flags: the vendored llama.cpp's names (common/arg.cpp),
old aliases included, and their `SpecConfig`.

Draft tokens come from n-grams of the prompt and the output so far (`--spec-type ngram-simple` or
`ngram-mod`: no second model) or from a draft model of the same vocabulary (`-md FILE`, type
draft-simple). Off by default, as in llama-server. engine/speculative/ says how drafts are verified.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from slotserver.engine.speculative.config import SPEC_TYPES, SpecConfig


def _add_types(namespace, value: str) -> None:
    """Append comma-separated types to the ones given so far (each once), as llama-server's --spec-type does."""
    have = [t for t in (namespace.spec_type or "").split(",") if t]
    namespace.spec_type = ",".join(have + [t for t in value.split(",") if t and t not in have])


class _SpecTypes(argparse.Action):
    """--spec-type A,B: added to the types given before (a repeated --spec-type adds, as llama-server's)."""

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        _add_types(namespace, value)


class _SpecDefault(argparse.Action):
    """llama-server's --spec-default: ngram-mod added to the types, n_match 24, n_min 48, n_max 64 (later
    --spec-ngram-mod-* flags override the numbers, and a later --spec-type adds types, as there)."""

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        _add_types(namespace, "ngram-mod")
        namespace.spec_ngram_mod_n_match, namespace.spec_ngram_mod_n_min, namespace.spec_ngram_mod_n_max = 24, 48, 64


def add_spec_args(p: argparse.ArgumentParser) -> None:
    a, d = p.add_argument, SpecConfig()
    a("--spec-type", action=_SpecTypes, default=None, metavar="TYPES",
      help=f"comma-separated speculative decoding types: {', '.join(SPEC_TYPES)} (default none; "
           "draft-simple when -md is given)")
    a("--spec-draft-hf", "-hfd", "-hfrd", "--hf-repo-draft", dest="spec_draft_hf", default=None,
      metavar="USER/MODEL[:QUANT]", help="the draft model from the Hugging Face hub, as -hf (cli/hub_args.py)")
    a("-md", "--spec-draft-model", "--model-draft", dest="spec_draft_model", type=Path, default=None,
      metavar="FNAME", help="draft model for speculative decoding (same vocabulary as the model)")
    for flags, name, kind, text in (
            (("--spec-draft-n-max", "--draft", "--draft-n", "--draft-max"), "draft_n_max", int,
             "tokens to draft with the draft model"),
            (("--spec-draft-n-min", "--draft-min", "--draft-n-min"), "draft_n_min", int,
             "fewer draft tokens than this are not verified"),
            (("--spec-draft-p-min", "--draft-p-min"), "draft_p_min", float,
             "stop drafting below this probability of the draft's top token (greedy)"),
            (("--spec-ngram-simple-size-n",), "ngram_simple_size_n", int, "ngram-simple: length of the lookup n-gram"),
            (("--spec-ngram-simple-size-m",), "ngram_simple_size_m", int, "ngram-simple: length of the drafted m-gram"),
            (("--spec-ngram-mod-n-match",), "ngram_mod_n_match", int, "ngram-mod: lookup length"),
            (("--spec-ngram-mod-n-min",), "ngram_mod_n_min", int, "ngram-mod: shortest draft"),
            (("--spec-ngram-mod-n-max",), "ngram_mod_n_max", int, "ngram-mod: longest draft")):
        a(*flags, dest="spec_" + name, type=kind, default=getattr(d, name), metavar="N",
          help=f"{text} (default {getattr(d, name)})")
    a("--spec-synth-rates", default=None, metavar="P0,P1,...",
      help="benchmarking only: accept draft position i at random with these non-increasing rates "
           "(as many as the draft's n_max) instead of by match; the output is then not the model's")
    a("--spec-synth-len", type=float, default=None, metavar="L",
      help="benchmarking only: synthetic acceptance with this mean accepted length (target token included)")
    a("--spec-default", action=_SpecDefault, nargs=0, help="llama-server's default speculative decoding: ngram-mod "
      "(n-match 24, n-min 48, n-max 64)")
    a("--spec-adaptive", dest="spec_adaptive", action=argparse.BooleanOptionalAction, default=True,
      help="shorten and pause drafts while they are rejected, so speculation never costs much (default on)")
