"""`slotserver generate "prompt"` and `slotserver generate --chat`: stream text to the terminal."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

from slotserver.cli.lab import add_lab_arg, apply_lab_dir  # light: no torch
from slotserver.cli.llama_env import device_name   # llama-server's -dev names
from slotserver.cli.hub_args import add_hub_args, fetch_hub_models
from slotserver.cli.model_meta_args import add_model_meta_args

DTYPE_NAMES = ("auto", "float32", "bfloat16")  # slotserver.model.config.DTYPES, without importing torch here


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text from a prompt, or chat (--chat)")
    p.add_argument("prompt", nargs="?", help="the prompt; '-' reads it from stdin")
    p.add_argument("--chat", action="store_true", help="interactive chat using the model's template")
    add_model_args(p)
    p.add_argument("-n", "--n-predict", type=int, default=128, help="tokens to generate (default 128)")
    p.add_argument("--temp", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=-1)
    p.add_argument("--system", default=None, help="system message for --chat")
    p.add_argument("-sp", "--special", action="store_true",
                   help="control tokens' text in the output (<|im_end|>...), as llama-cli -sp")
    p.set_defaults(run=run)


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", type=Path, default=None, help="GGUF file (default: embedded SmolLM2-135M)")
    p.add_argument("--dtype", choices=DTYPE_NAMES, default="auto",   # ModelConfig.torch_dtype decides
                   help="compute dtype. auto (default): float32 with the GGUF blocks (the default --weights, and "
                        "q), as llama.cpp; with dequantized --weights (dense, int8, int4, auto8, auto4) bfloat16 "
                        "where the CPU computes it natively (AVX512-BF16/AMX), else float32. float32: with "
                        "--weights auto, the exact dequantized reference mode. bfloat16: bf16 attention and KV "
                        "(matmuls on GGUF blocks stay float32)")
    p.add_argument("--weights", choices=["auto", "q", "dense", "int8", "int4", "auto8", "auto4"], default="auto",
                   help="matmul weights. auto (default): the GGUF blocks computed on in place (qmatmul); with "
                        "--dtype float32 the exact dequantized weights (the reference). q: the blocks whatever the "
                        "dtype. dense / int8 / int4 / auto8 / auto4: dequantized at load")
    p.add_argument("--device", "-dev", type=device_name, choices=["auto", "cpu", "cuda"], default="auto",
                   help="where to compute. auto (default): the GPU when torch sees one (as llama.cpp offloads by "
                        "default), else the CPU. cuda: the Triton kernels, weights dequantized to --dtype (bfloat16 "
                        "with auto) for cuBLAS; an error without a GPU. llama-server's names too: none (the CPU), "
                        "CUDA0 (the first visible GPU)")
    p.add_argument("--gpu-weights", choices=["auto", "dense", "blocks"], default="auto",
                   help="matmul weights on --device cuda (with --weights auto). dense: dequantized to bf16 at load, "
                        "cuBLAS. blocks: the GGUF blocks as in the file, Triton dequantize-matmul (a third of the "
                        "memory for Q4_K). auto (default): dense where it fits in half the card's free memory, "
                        "else blocks")
    p.add_argument("--fused-gemv", choices=["on", "off"], default="off",
                   help="on --device cuda with dense weights: decode steps of up to 16 rows on fused GEMV kernels "
                        "(norm, bias, rope, gate and residual add inside the matmuls: kernels/gemv.py) instead of "
                        "cuBLAS and separate kernels; off (default): faster only at one row of a small model (docs/gpu.md)")
    p.add_argument("-t", "--threads", type=int, default=0,
                   help="compute threads (default 0: the physical cores this process may use, as llama.cpp)")
    p.add_argument("--tp", type=int, default=0,
                   help="tensor parallelism over N ranks (torch.distributed, gloo on the CPU): spawns ranks "
                        "1..N-1 on this machine, or takes them from torchrun's environment (docs/scaling.md)")
    p.add_argument("--check-tensors", action="store_true",
                   help="check every tensor's data for NaN/inf at load, as llama.cpp's flag (refuses a broken file)")
    p.add_argument("--layout", default="head_seq_dim",   # ModelConfig's DEFAULT_LAYOUT (that module imports torch)
                   help="KV layout, a module of layouts/ (default head_seq_dim)")
    p.add_argument("--kernels-dir", type=Path, default=None)
    p.add_argument("--layouts-dir", type=Path, default=None)
    p.add_argument("--lora", dest="lora_items", action="append", default=[], type=lambda v: ("", v), metavar="FNAME",
                   help="a LoRA adapter GGUF at scale 1 (comma-separated: several; repeatable); ids in command-line order")
    p.add_argument("--lora-scaled", dest="lora_items", action="append", type=lambda v: (":", v),
                   metavar="FNAME:SCALE,...", help="a LoRA adapter GGUF at SCALE (comma-separated: several; repeatable)")
    add_model_meta_args(p)
    add_hub_args(p)
    add_lab_arg(p)


def start_tp(args):
    """--tp N: this process's TPSession (None without); -t 0 becomes this rank's share of the cores."""
    if not args.tp or args.tp == 1 and "WORLD_SIZE" not in os.environ:   # --tp 1: the plain path, unchanged
        return None
    from slotserver.parallel.session import TPSession
    from slotserver.runtime.cpu_features import physical_cores

    tp = TPSession.start(args.tp, args.argv)
    if tp is not None and args.threads == 0:
        args.threads = tp.threads(physical_cores())
    return tp


def load_bundle(args):
    apply_lab_dir(args)
    fetch_hub_models(args)   # -hf: args.model from the hub
    from slotserver.model.bundle import ModelBundle
    from slotserver.model import metadata_overrides
    from slotserver.model.config import ModelConfig, lora_flags
    from slotserver.model.rope_scaling import RopeFlags
    from slotserver.model.default_model import default_model_path
    from slotserver.model.progress import load_progress

    config = ModelConfig(model_path=args.model or default_model_path(), dtype=args.dtype,
                         threads=args.threads, layout=args.layout, kernels_dir=args.kernels_dir, weights=args.weights,
                         gpu_weights=args.gpu_weights, fused_gemv=args.fused_gemv == "on",
                         layouts_dir=args.layouts_dir, device=args.device, lora=lora_flags(args.lora_items),
                         rope_flags=RopeFlags.from_args(args), kv_overrides=metadata_overrides.from_args(args),
                         control_vectors=lora_flags(args.control_items, "--control-vector-scaled"),
                         control_layers=tuple(args.control_layers) if args.control_layers else None)
    with load_progress(f"loading {config.model_path.name}") as tick:
        return ModelBundle.load(config, tick, check_tensors=args.check_tensors)


def run(args) -> int:
    if not args.chat and args.prompt is None:
        print("slotserver generate: error: give a prompt (or '-' for stdin), or --chat", file=sys.stderr)
        return 2
    if args.lora_items and args.tp > 1:
        print("slotserver generate: error: --tp does not run with --lora (the adapters' deltas are not sharded)",
              file=sys.stderr)
        return 2
    gc.disable()   # for start-up only, as `serve` does (cli/serve.py says why)
    try:
        from slotserver.model.sampling.params import SamplingParams

        params = SamplingParams(temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                                min_p=args.min_p, repeat_penalty=args.repeat_penalty, seed=args.seed)
        args.tp_session = tp = start_tp(args)
        bundle = load_bundle(args)
        if tp is not None:
            tp.prepare(bundle.model)
        gc.freeze()
    finally:
        gc.enable()
    if tp is not None and not tp.leads:
        tp.serve(bundle.model)   # ranks 1..N-1: the forward only, until rank 0 is done
        return 0
    try:
        if args.chat:
            return chat_loop(bundle, args, params)
        prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
        ids = bundle.tokenizer.encode(prompt, add_special=True, parse_special=True)
        stream(bundle, args, ids, params)
        sys.stdout.write("\n")
        return 0
    finally:
        if tp is not None:
            tp.stop()


def stream(bundle, args, ids: list[int], params) -> str:
    """Generate from `ids`, writing text to stdout as it completes; returns the text."""
    from slotserver.model.text.detokenizer import IncrementalDetokenizer
    from slotserver.model.generate import GenRequest, generate

    special = getattr(args, "special", False)
    detok = IncrementalDetokenizer(bundle.tokenizer, special=special)
    eog = bundle.tokenizer.eog_ids

    def on_token(_: int, token: int) -> None:
        if token not in eog or special:
            sys.stdout.write(detok.push(token))
            sys.stdout.flush()

    n_predict = max(0, min(args.n_predict, bundle.model.rope.max_pos - len(ids)))
    tp = getattr(args, "tp_session", None)
    make_cache = (lambda spec: tp.cache(spec, args.layout, args.layouts_dir)) if tp is not None else None
    lora = tuple(scale for _, scale in bundle.config.lora)   # --lora / --lora-scaled: this prompt's scales
    generate(bundle.model, [GenRequest(ids, n_predict, params, lora=lora)], eog, on_token,
             layout=args.layout, layouts_dir=args.layouts_dir, make_cache=make_cache)
    tail = detok.flush()
    sys.stdout.write(tail)
    return detok.text


def chat_loop(bundle, args, params) -> int:
    messages = [{"role": "system", "content": args.system}] if args.system else []
    interactive = sys.stdin.isatty()
    if interactive:
        print("chat with the model; an empty line or Ctrl-D ends", file=sys.stderr)
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            return 0
        if not line.strip():
            return 0
        messages.append({"role": "user", "content": line})
        text = bundle.template.render(messages, add_generation_prompt=True)
        ids = bundle.tokenizer.encode(text, add_special=True, parse_special=True)
        reply = stream(bundle, args, ids, params)
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": reply})
