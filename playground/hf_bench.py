"""Hugging Face transformers' own generate loop: what a Python user would run instead of slotserver.

Measures greedy decode speed of `model.generate(..., cache_implementation="static")` on a
random-weight model of Qwen2.5-0.5B's shape (built from its config with torch.manual_seed(0), no
download) in bf16, per batch size, so that slotserver's decode tok/s has a baseline on the same
card. For each batch size: a random prompt of --prompt-len tokens per row, one warm-up generate of
the full --steps tokens (it allocates the static cache at its final size and, where transformers
auto-compiles the static-cache forward on CUDA, pays torch.compile there, outside the timings), then
a timed 1-token generate (prefill + the first token) and a timed --steps-token generate. Decode is
their difference: ms/step = (t_N - t_1) / (N - 1), tok/s = batch * (N - 1) / (t_N - t_1) (prefill
subtracted); e2e tok/s = batch * N / t_N. Each time is the best of --repeats calls.

    PYTHONPATH=. python playground/hf_bench.py [--out DIR] [--batches 1,8,32,64] [--steps 64]
    .venv/bin/python playground/hf_bench.py --device cpu --tiny --batches 1,2 --steps 4   # dry run

`--cache dynamic` uses transformers' default (dynamic) cache; `--no-compile` passes
disable_compile=True (static cache without transformers' auto torch.compile, which recent versions
apply to a static cache on CUDA: mode reduce-overhead, compiled in the warm-up). If a generate call
fails, the error is printed and the batch falls back to the static cache without auto-compile, then
to the default cache; the row names what ran.
One line per batch, and with --out, DIR/hf_bench.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

QWEN_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6,
                rms_norm_eps=1e-6, tie_word_embeddings=True)
TINY = dict(QWEN_05B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1000)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,32,64", help="comma-separated batch sizes")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=64, help="new tokens per timed generate")
    ap.add_argument("--cache", choices=("static", "dynamic"), default="static")
    ap.add_argument("--no-compile", action="store_true", help="disable_compile=True (no auto torch.compile)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tiny", action="store_true", help="2 layers, hidden 64, vocab 1000 (a CPU dry run)")
    ap.add_argument("--repeats", type=int, default=2, help="timed calls per measurement (the best is kept)")
    ap.add_argument("--budget-s", type=float, default=90.0, help="start no new batch size after this many seconds")
    ap.add_argument("--out", type=Path, default=None, help="folder for hf_bench.json")
    return ap.parse_args(argv)


def versions(device: str) -> dict:
    import transformers

    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else (platform.processor() or "cpu")
    return {"torch": torch.__version__, "transformers": transformers.__version__, "device": name,
            "python": platform.python_version()}


def build_model(tiny: bool, device: str, dtype: torch.dtype):
    """A random-weight Qwen2 of Qwen2.5-0.5B's shape (or the tiny one), eval mode, on `device` in `dtype`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**(TINY if tiny else QWEN_05B))
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    return model.to(dtype=dtype).eval()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class Generator:
    """generate() with the chosen cache. If a call fails, the next of a few fallbacks (static without
    transformers' auto-compile, then the default cache) is tried, and the row says which ran and why."""

    def __init__(self, model, cache: str, no_compile: bool, device: str) -> None:
        self.model, self.device = model, device
        if cache == "static":   # (label, cache_implementation, extra generate kwargs)
            self.configs = [("static", "static", {}), ("static, disable_compile", "static", {"disable_compile": True}),
                            ("default cache", None, {})][1 if no_compile else 0:]
        else:
            self.configs = [("dynamic", None, {})]
        self.note = ""

    @property
    def label(self) -> str:
        return self.configs[0][0]

    def kwargs(self, n: int) -> dict:
        _, cache, extra = self.configs[0]
        kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0, **extra)
        if cache:
            kw["cache_implementation"] = cache
        return kw

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, n: int) -> torch.Tensor:
        try:
            return self.model.generate(input_ids=ids, attention_mask=mask, **self.kwargs(n))
        except Exception as e:  # noqa: BLE001 - version differences: say so, retry with fewer options
            if len(self.configs) == 1:
                raise
            failed = self.configs.pop(0)[0]
            self.note += f"{'; ' if self.note else ''}{failed} failed ({type(e).__name__}: {str(e)[:120]})"
            print(f"  generate ({failed}) failed: {type(e).__name__}: {str(e)[:200]} -> falling back to "
                  f"{self.label}", flush=True)
            return self(ids, mask, n)

    def timed(self, ids: torch.Tensor, mask: torch.Tensor, n: int, repeats: int) -> float:
        """Best wall seconds of `repeats` generates of exactly n new tokens."""
        best = float("inf")
        for _ in range(max(1, repeats)):
            sync(self.device)
            t = time.perf_counter()
            out = self(ids, mask, n)
            sync(self.device)
            best = min(best, time.perf_counter() - t)
            assert out.shape[1] == ids.shape[1] + n, f"generated {out.shape[1] - ids.shape[1]} tokens, wanted {n}"
        return best


def bench_batch(gen: Generator, vocab: int, batch: int, args: argparse.Namespace) -> dict:
    """One batch size: warm-up, the timed 1-token and N-token generates, the derived rates."""
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(0, vocab, (batch, args.prompt_len), generator=g).to(args.device)
    mask = torch.ones_like(ids)
    n = args.steps
    for _ in range(3):   # again from the warm-up if a timed call fell back to another configuration
        label = gen.label
        t = time.perf_counter()
        gen(ids, mask, n)                   # warm-up: cache at its final size, any auto-compile
        sync(args.device)
        warm_s = time.perf_counter() - t
        t1 = gen.timed(ids, mask, 1, args.repeats)
        tn = gen.timed(ids, mask, n, args.repeats)
        if gen.label == label:
            break
    decode_s = max(tn - t1, 1e-9)
    return {"batch": batch, "cache": gen.label, "note": gen.note, "prompt_len": args.prompt_len, "new_tokens": n,
            "warmup_s": warm_s, "t_1token_s": t1, "t_ntokens_s": tn,
            "ms_per_step": 1e3 * decode_s / max(1, n - 1), "decode_tok_s": batch * (n - 1) / decode_s,
            "e2e_tok_s": batch * n / tn, "prefill_tok_s": batch * args.prompt_len / t1}


def run_batches(model, args: argparse.Namespace, t_start: float) -> tuple[list[dict], list[int]]:
    """Every batch size until the budget is spent: one printed line and one row each (failures too)."""
    rows, skipped = [], []
    gen = Generator(model, args.cache, args.no_compile, args.device)   # shared: a fallback holds for the rest
    for batch in (int(b) for b in args.batches.split(",") if b.strip()):
        if time.time() - t_start > args.budget_s:
            skipped.append(batch)
            continue
        try:
            r = bench_batch(gen, model.config.vocab_size, batch, args)
        except Exception as e:  # noqa: BLE001 - one failing batch size costs its row, not the run
            print(f"hf b={batch} {gen.label}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            rows.append({"batch": batch, "cache": gen.label, "error": f"{type(e).__name__}: {e}"[:500]})
        else:
            rows.append(r)
            note = f" [{r['note']}]" if r["note"] else ""
            print(f"hf b={batch} {r['cache']}: {r['ms_per_step']:.2f} ms/step, {r['decode_tok_s']:.0f} tok/s decode "
                  f"(e2e {r['e2e_tok_s']:.0f} tok/s; prefill {1e3 * r['t_1token_s']:.1f} ms, "
                  f"warm-up {r['warmup_s']:.1f} s){note}", flush=True)
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    return rows, skipped


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.time()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu --tiny for a dry run", file=sys.stderr)
        return 2
    import transformers

    transformers.logging.set_verbosity_error()
    info = versions(args.device)
    print(" ".join(f"{k} {v}," for k, v in info.items()).rstrip(","), flush=True)
    dtype = getattr(torch, args.dtype)
    model = build_model(args.tiny, args.device, dtype)
    attn = getattr(model.config, "_attn_implementation", "?")
    print(f"model: {'tiny' if args.tiny else 'Qwen2.5-0.5B shape'}, random weights, {args.dtype}, attention {attn}, "
          f"build {time.time() - t_start:.1f} s; prompt {args.prompt_len}, {args.steps} new tokens, "
          f"cache {args.cache}{', no compile' if args.no_compile else ''}", flush=True)
    rows, skipped = run_batches(model, args, t_start)
    if skipped:
        print(f"skipped batch sizes (time budget {args.budget_s:.0f} s): {skipped}")
    print(f"wall {time.time() - t_start:.0f} s", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "hf_bench.json").write_text(json.dumps(
            {**info, "args": {k: str(v) for k, v in vars(args).items()}, "attention": attn, "rows": rows,
             "skipped": skipped}, indent=1))
    return 0 if rows and all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
