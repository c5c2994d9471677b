"""What a user sees is the same on every CPU family: AVX2 only, AVX-512 (BF16/VNNI), AVX-512 + AMX.

Each variant the host can run (`SLOTSERVER_CPU`, plus torch's own ISA caps from
`cpu_features.emulation_env`, so torch behaves like such a host too) and the torch-only form
(`SLOTSERVER_NATIVE=0`) runs in its own process (the choices are made once per process):
- every kernel module's CPU form matches its torch reference, in float32 and bfloat16, and the
  native C library was built wherever a compiler is here (the C must compile for the variant);
- a tiny model's greedy generation equals the torch-only float32 reference (up to a near-tie), in
  float32, and in bfloat16 with the serving default `auto4` weights (Q4_1 file: int4 paths, the
  AMX kernel where the variant has it) up to bf16's tolerance.

Run directly (`python tests/test_cpu_variants.py OUT.json`) this file is the child: it writes
what it saw as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
PROMPTS = ([1, 2, 3, 4, 5], [300, 12, 7])
N_PREDICT = 12
NEEDS = {"avx2": "needs avx2", "avx512": "needs avx512f", "amx": "needs amx_tile"}
F32_TIE, BF16_TIE = 1e-3, 0.3   # log-prob margins under which two correct forms may pick differently


def _kernels_report() -> dict:
    """op -> {"native": C library built, dtype: (max error, tolerance, ok)} on a few random inputs."""
    import torch

    from slotserver.runtime.kernel_set import KERNEL_CONTRACT
    from slotserver.lab.check import compare_outputs, move_inputs
    from slotserver.runtime.loader import default_dir, load_by_path

    out = {}
    for path in sorted(default_dir("kernels").glob("*.py")):
        if path.stem.startswith("_"):
            continue
        mod = load_by_path(path, KERNEL_CONTRACT).module
        row = {"has_c": getattr(mod, "NATIVE_C", None) is not None, "native": getattr(mod, "_LIB", None) is not None}
        for dtype in (torch.float32, torch.bfloat16):
            gen, worst, ok = torch.Generator().manual_seed(99), 0.0, True
            for _ in range(5):
                inputs = mod.example_inputs(gen, dtype)
                got, want = mod.cpu(*move_inputs(inputs, "cpu")), mod.reference(*move_inputs(inputs, "cpu"))
                err, good = compare_outputs(got, want, mod.TOL[dtype])
                worst, ok = max(worst, float(err)), ok and bool(good)
            row[str(dtype)] = (worst, float(mod.TOL[dtype]), ok)
        out[path.stem] = row
    return out


def _generate(path: Path, dtype_name: str, fmt: str) -> list[dict]:
    """Greedy generation (ignore_eos) -> per prompt: tokens and the top-2 log-prob margin per step."""
    import torch

    from slotserver.model.generate import GenRequest, generate
    from slotserver.model.model import LlamaModel
    from slotserver.model.sampling.sampler import SamplingParams
    from slotserver.model.weights import WeightFormat

    model = LlamaModel.load(path, getattr(torch, dtype_name), max_pos=64, fmt=WeightFormat(fmt))
    reqs = [GenRequest(list(p), N_PREDICT, SamplingParams(temperature=0.0, n_probs=2), ignore_eos=True)
            for p in PROMPTS]
    return [{"tokens": r.tokens, "margins": [t[0][1] - t[1][1] for t in r.top]}
            for r in generate(model, reqs, frozenset())]


def child(out: Path) -> None:
    """Everything a user would see under this process's environment, written to `out` as JSON."""
    from slotserver.runtime import cpu_features
    from slotserver.model import linear
    from slotserver.runtime.kernel_set import KERNEL_CONTRACT
    from slotserver.runtime.loader import default_dir, load_by_path
    q4_matmul = load_by_path(default_dir("kernels") / "q4_matmul.py", KERNEL_CONTRACT).module
    from tiny_gguf import QT, write_tiny_gguf

    model = write_tiny_gguf(out.with_suffix(".gguf"), d_model=64, d_ff=128, tensor_type=QT.Q4_1)
    from slotserver.runtime.kernel_paths import cpu_report
    from slotserver.runtime.kernel_set import KernelSet

    report = {
        "variant": cpu_features.current().variant, "amx": q4_matmul.available(),
        "cpu_report": cpu_report({op: m.module for op, m in KernelSet.load().modules.items()}),
        "f32_q": _generate(model, "float32", "q"),
        "prepack": linear.prepack_available(), "kernels": _kernels_report(),
        "f32": _generate(model, "float32", "dense"), "bf16_auto4": _generate(model, "bfloat16", "auto4"),
    }
    out.write_text(json.dumps(report))


def run_child(tmp: Path, name: str, env: dict[str, str]) -> dict:
    out = tmp / f"{name}.json"
    caps = ("SLOTSERVER_CPU", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "SLOTSERVER_NATIVE")
    full = {k: v for k, v in os.environ.items() if k not in caps} | env   # only `env` decides the path
    proc = subprocess.run([sys.executable, str(HERE), str(out)], env=full, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"{name}: child failed:\n{proc.stderr[-3000:]}"
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The torch-only run (no C kernels) on this host: the float32 generation everything must match."""
    return run_child(tmp_path_factory.mktemp("ref"), "native0", {"SLOTSERVER_NATIVE": "0"})


def assert_same_generation(got: list[dict], want: list[dict], tie: float) -> None:
    """Equal tokens; a divergence is allowed only where the reference's top two were within `tie`
    (a near-tie that rounding may flip), and ends the comparison (the contexts differ after it)."""
    for g, w in zip(got, want, strict=True):
        assert len(g["tokens"]) == len(w["tokens"]) == N_PREDICT
        for i, (a, b) in enumerate(zip(g["tokens"], w["tokens"])):
            if a != b:
                assert w["margins"][i] < tie, f"step {i} without a near-tie: {g['tokens']} vs reference {w['tokens']}"
                break


def assert_kernels_match(report: dict, native: bool) -> None:
    for op, row in report["kernels"].items():
        for dtype in ("torch.float32", "torch.bfloat16"):
            err, tol, ok = row[dtype]
            assert ok, f"{op} {dtype}: max error {err:.3g} > tol {tol}"
        if row["has_c"]:
            assert row["native"] == native, f"{op}: C library built = {row['native']}, expected {native}"


def test_torch_only_form_matches_the_references(reference):
    assert_kernels_match(reference, native=False)
    assert not reference["amx"]
    assert_same_generation(reference["bf16_auto4"], reference["f32"], BF16_TIE)
    assert_same_generation(reference["f32_q"], reference["f32"], BF16_TIE)
    # what /props and /lab tell the user: no C kernel serves
    assert all(path.startswith("torch") for path in reference["cpu_report"]["kernels"].values()), reference["cpu_report"]


@pytest.mark.parametrize("variant", ["avx2", "avx512", "amx"])
def test_each_cpu_variant_gives_the_reference_outputs(variant, reference, tmp_path):
    from slotserver.runtime import cpu_features
    from slotserver.runtime import native

    if not cpu_features.supports(variant):
        pytest.skip(NEEDS[variant])
    got = run_child(tmp_path, variant, cpu_features.emulation_env(variant))
    assert got["variant"] == variant
    assert_kernels_match(got, native=native.compiler() is not None)
    assert not (variant == "avx2" and got["prepack"])     # an AVX2 host has no oneDNN bf16 re-blocking
    assert not got["amx"] or variant == "amx"             # the AMX kernel only where the variant has it
    assert_same_generation(got["f32"], reference["f32"], F32_TIE)
    assert_same_generation(got["bf16_auto4"], reference["f32"], BF16_TIE)
    assert_same_generation(got["f32_q"], reference["f32"], BF16_TIE)   # the AVX2 default: GGUF blocks
    shown = got["cpu_report"]      # what /props, /lab and `slotserver top` report
    assert shown["variant"] == variant and shown["forced"]      # SLOTSERVER_CPU chose it
    assert variant == "amx" or not any(f.startswith("amx") for f in shown["isa"])
    assert variant != "avx2" or not any(f.startswith("avx512") for f in shown["isa"])
    if native.compiler() is not None:
        assert ("AVX2 maddubs" in shown["kernels"]["qmatmul"]) == (variant == "avx2"), shown["kernels"]["qmatmul"]
        assert shown["kernels"]["q4_matmul"].startswith("AMX") == got["amx"]
        assert ("AMX" in shown["kernels"]["attention"]) == got["amx"], shown["kernels"]["attention"]  # prompt rows


def test_default_threads_are_the_physical_cores():
    """`-t` unset: one thread per physical core (hyper-thread siblings count once), as llama.cpp."""
    from slotserver.runtime.cpu_features import physical_cores

    two_cores_four_threads = "".join(f"processor : {i}\nphysical id : 0\ncore id : {i // 2}\n\n" for i in range(4))
    assert physical_cores(two_cores_four_threads, allowed={0, 1, 2, 3}) == 2
    assert physical_cores(two_cores_four_threads, allowed={0, 1}) == 1          # taskset to one core's siblings
    two_sockets = "".join(f"processor : {i}\nphysical id : {i // 2}\ncore id : {i % 2}\n\n" for i in range(4))
    assert physical_cores(two_sockets, allowed={0, 1, 2, 3}) == 4
    assert physical_cores("", allowed={0, 1, 2}) == 3                           # no topology: usable CPUs
    assert 1 <= physical_cores() <= (os.cpu_count() or 1)


if __name__ == "__main__":
    child(Path(sys.argv[1]))
