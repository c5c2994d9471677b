"""Whole generations: the Triton kernels (run by triton's interpreter on CPU) give the same greedy
tokens as the CPU kernels on a tiny model, for every layout; and on the default model every layout
gives seq_head_dim's greedy tokens with the CPU kernels (q8 within a stated agreement rate).

The interpreted half runs in a subprocess (this file run as a script with TRITON_INTERPRET=1):
triton fixes interpret-or-compile at its first import, which already happened in pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slotserver.model.generate import GenRequest, generate
from slotserver.runtime.kernel_set import KernelSet
from slotserver.model.model import LlamaModel
from slotserver.model.weights import WeightFormat

LAYOUTS = ["seq_head_dim", "head_seq_dim", "paged", "paged_hnd", "q8"]
PROMPTS = [[5, 17, 200, 33, 1, 90, 41], [7, 8, 9], [100, 220, 3, 250, 61, 62, 63, 64, 65, 66, 12]]
N_PREDICT = 6   # each layout's interpreted generation is the fixture's time
MARK = "TRITON-GENERATION "


def _generate_all(gguf: Path, impl: str) -> dict[str, list[list[int]]]:
    """Greedy tokens of PROMPTS (one ragged batch) for every layout, with the `impl` kernels."""
    model = LlamaModel.load(gguf, kernels=KernelSet.load(impl=impl))
    reqs = [GenRequest(list(p), N_PREDICT, ignore_eos=True) for p in PROMPTS]
    return {lay: [r.tokens for r in generate(model, reqs, frozenset(), layout=lay)] for lay in LAYOUTS}


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    from tiny_gguf import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


@pytest.fixture(scope="module")
def triton_tokens(tiny_gguf) -> dict[str, list[list[int]]]:
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, __file__, str(tiny_gguf)], capture_output=True, text=True,
                          env=env, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len(MARK):])


@pytest.fixture(scope="module")
def cpu_tokens(tiny_gguf) -> dict[str, list[list[int]]]:
    return _generate_all(tiny_gguf, "cpu")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_triton_kernels_generate_the_cpu_kernels_tokens(triton_tokens, cpu_tokens, layout):
    assert triton_tokens[layout] == cpu_tokens[layout]
    assert all(len(t) == N_PREDICT for t in cpu_tokens[layout])
    if layout != "q8":  # float layouts hold the same numbers: the same tokens as seq_head_dim
        assert cpu_tokens[layout] == cpu_tokens["seq_head_dim"]


DEFAULT_PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time",
                   "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n"]
# measured on SmolLM2-135M: 100% on its GGUF blocks (40/40 at 10 tokens) and on the exact dequantized
# float32 weights (40/40 at 10, 64/64 at 16); the bar leaves room for a flipped near-tie on other CPUs
Q8_MIN_AGREEMENT = 0.75


@pytest.fixture(scope="module")
def default_runs(smollm_path, tokenizer) -> dict[str, list[list[int]]]:
    """The default model on `serve`'s matmuls (its GGUF blocks) with float32 activations and K/V:
    a layout only stores the K/V, so the matmuls' format is not what is tested, and the blocks
    decode ~4.6x faster on one core than the exact dequantized float32 weights (this fixture: 11 ->
    ~3 s in the suite)."""
    model = LlamaModel.load(smollm_path, fmt=WeightFormat("q"))
    reqs = [GenRequest(tokenizer.encode(p, parse_special=True), 10, ignore_eos=True) for p in DEFAULT_PROMPTS]
    return {lay: [r.tokens for r in generate(model, reqs, tokenizer.eog_ids, layout=lay)] for lay in LAYOUTS}


@pytest.mark.parametrize("layout", [lay for lay in LAYOUTS if lay != "q8"])
def test_default_model_every_float_layout_gives_the_same_greedy_tokens(default_runs, layout):
    assert default_runs[layout] == default_runs["seq_head_dim"]


def test_default_model_q8_agrees_with_float_on_most_tokens(default_runs):
    """Greedy decoding diverges for good after the first flipped token, so count the agreeing
    prefix of each sequence (the strict measure), not per-position equality."""
    ref, q8 = default_runs["seq_head_dim"], default_runs["q8"]
    agree = sum(_common_prefix(a, b) for a, b in zip(ref, q8))
    rate = agree / sum(len(a) for a in ref)
    print(f"q8 vs float32 greedy agreement (common prefix): {agree}/{sum(len(a) for a in ref)} = {rate:.0%}")
    assert rate >= Q8_MIN_AGREEMENT


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


if __name__ == "__main__":  # the interpreted half, run by the `triton_tokens` fixture
    from slotserver.lab.check import triton_mode

    assert triton_mode() == "interpret", "run with TRITON_INTERPRET=1"
    print(MARK + json.dumps(_generate_all(Path(sys.argv[1]), "triton")))
