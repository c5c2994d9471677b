"""Serving on CPU does not import triton (~0.2 s and ~71 MiB of the start): kernel files run with
stand-ins (slotserver/runtime/lazy_triton.py). Their Triton kernels still work on first use, made real
then, interpreted here, and equal to the reference; the AOT compiler gets real kernels."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import sys, torch
    from slotserver.runtime.kernel_set import KernelSet
    from slotserver.model.bundle import ModelBundle
    from slotserver.model.config import ModelConfig
    from slotserver.model.default_model import default_model_path
    ks = KernelSet.load()
    bundle = ModelBundle.load(ModelConfig(default_model_path(), dtype="auto"))
    assert "triton" not in sys.modules, "loading kernels and the model imported triton"
    mod = ks.modules["rms_norm"].module
    x, w = torch.randn(5, 64), torch.rand(64) + 0.5
    got = mod.triton(x, w, 1e-5)                  # first use: triton imported, kernel made real
    assert "triton" in sys.modules and type(mod._rms_norm_kernel).__name__ == "InterpretedFunction"
    assert type(mod._triton).__name__ == "module" and mod._triton is sys.modules["triton"]
    assert torch.allclose(got, mod.reference(x, w, 1e-5), atol=1e-5), (got - mod.reference(x, w, 1e-5)).abs().max()
    from slotserver.runtime.lazy_triton import resolve
    qm = ks.modules["qmatmul"].module
    assert type(resolve(qm.AOT[0][0])).__name__ == "InterpretedFunction"   # recorded before the import: made real
    # a kernel's parts (runtime/kernel_parts.py) ran under its stand-ins: its first use makes their
    # kernels and the helpers they call across parts real too (qmatmul_gpu: the wide GEMV, q8_1, blocks)
    from slotserver.runtime.qblocks import T, random_qweight
    qg = ks.modules["qmatmul_gpu"].module
    w8, x8 = random_qweight(torch.Generator().manual_seed(0), T.Q8_0, 8, 64), torch.randn(2, 64)
    want = qg.reference(x8, w8)
    assert float((qg.triton(x8, w8) - want).abs().max()) < 3e-2 * (1 + float(want.abs().max()))
    wide = qg.wide
    assert all(type(f).__name__ == "InterpretedFunction" for f in
               (wide._wide_kernel, wide._word, wide._blocks._word, wide._q8_1._q8_1_kernel, qg.slices._dequant32))
    # a module's first launch must know it is interpreted: its kernels are still stand-ins then (the
    # bf16 prefill once took the dot the interpreter multiplies as bit patterns, on the first call only)
    att = ks.modules["attention"].module
    inputs = next(i for i in (att.example_inputs(torch.Generator().manual_seed(s), torch.bfloat16) for s in range(50))
                  if i[2].max_q > 1)
    assert torch.equal(att.triton(*inputs), att.triton(*inputs))
    print("ok")
""")


def test_kernels_and_model_load_without_triton_and_triton_kernels_still_run():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
