"""llama-server's hub flags, for `serve` and `generate`: `-hf USER/REPO[:QUANT]` downloads (or finds
in the cache) the model that `-m` then names (slotserver/hub/download.py), `-hff FILE` picks the
file, `-hft TOKEN` authenticates, `--offline` keeps to the cache, `-cl` lists the cache and exits,
`--spec-draft-hf` gets a draft model the same way.

With `-hf` the model's name in the API is the reference as typed (`ggml-org/gemma-3-1b-it-GGUF:Q4_K_M`),
as llama-server names it, unless `--alias` gives one.
"""

from __future__ import annotations

import argparse


class _CacheList(argparse.Action):
    """llama-server's -cl: the models in the hub cache, numbered, then exit 0."""

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        from slotserver.hub.cache import default_cache, list_models

        models = list_models(default_cache())
        print(f"number of models in cache: {len(models)}")
        for i, name in enumerate(models, 1):
            print(f"{i:4}. {name}")
        parser.exit(0)


def add_hub_args(p: argparse.ArgumentParser) -> None:
    """The model's hub flags (serve's --spec-draft-hf is with the speculative flags: spec_args.py)."""
    g = p.add_argument_group("models from the Hugging Face hub (llama-server's flags)")
    a = g.add_argument
    a("-hf", "-hfr", "--hf-repo", dest="hf_repo", default=None, metavar="USER/MODEL[:QUANT]",
      help="download the model from this hub repository into the hub cache (or take it from there); QUANT "
           "picks the file (default Q4_K_M, then Q8_0, then the first GGUF)")
    a("-hff", "--hf-file", dest="hf_file", default=None, metavar="FILE", help="the repository's file to take (over QUANT)")
    a("-hft", "--hf-token", dest="hf_token", default=None, metavar="TOKEN",
      help="hub access token (default: HF_TOKEN, or the stored login)")
    a("--offline", action="store_true", help="never reach the hub: -hf takes the model from the cache only")
    a("-cl", "--cache-list", action=_CacheList, nargs=0, help="list the models in the hub cache, then exit")


def fetch_hub_models(args) -> None:
    """-hf / --spec-draft-hf -> args.model / args.spec_draft_model (downloading where needed); a
    ConfigError (one line) for a bad reference, a missing file, a gated repository."""
    from slotserver.errors import ConfigError
    from slotserver.hub.download import fetch

    token = getattr(args, "hf_token", None)
    if getattr(args, "hf_repo", None):
        if args.model is not None:
            raise ConfigError("give -m FILE or -hf USER/MODEL, not both")
        args.model = fetch(args.hf_repo, args.hf_file, token, args.offline)
        if hasattr(args, "alias") and not args.alias:
            args.alias = [args.hf_repo]   # llama-server's model name with -hf
    elif getattr(args, "hf_file", None):
        raise ConfigError("-hff names a file of the -hf repository: give -hf USER/MODEL too")
    if getattr(args, "spec_draft_hf", None):
        if getattr(args, "spec_draft_model", None) is not None:
            raise ConfigError("give --spec-draft-model FILE or --spec-draft-hf USER/MODEL, not both")
        args.spec_draft_model = fetch(args.spec_draft_hf, None, token, args.offline)
