"""Time a gated delta-net layer alone at Qwen3.5-0.8B's shapes (16 q/k and 16 v heads of 128,
convolution width 4, 18 of its 24 layers recurrent), between its two matmuls (not timed: plain
matmuls like any layer's): decode steps of 1 and 8 sequences and one 512-token prompt, each through
the serving kernel (kernels/delta_net_step.py's `cpu`, one C call) and the same module's torch
`reference` (token by token, a sequence's heads at once).
Run: .venv/bin/python playground/delta_net_speed.py
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from slotserver.model.delta_net import GdnParams
from slotserver.model.recurrent_spec import RecurrentSpec
from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.runtime.cpu_features import current
from slotserver.runtime.kernel_set import KernelSet
from slotserver.runtime.recurrent_state import RecurrentState

LAYERS = 18


def main() -> None:
    r = RecurrentSpec(d_conv=4, n_k_heads=16, n_v_heads=16, head_k=128, head_v=128, layers=(True,))
    spec, gen = SimpleNamespace(recurrent=r, norm_eps=1e-6), torch.Generator().manual_seed(0)
    params = GdnParams(conv=torch.randn(r.conv_dim, 4, generator=gen) * 0.3, dt_bias=torch.rand(16, generator=gen),
                       a=-torch.rand(16, generator=gen) - 0.5, norm=torch.ones(128))
    kernels = KernelSet.load()
    reference = SimpleNamespace(delta_net_step=kernels.modules["delta_net_step"].module.reference)
    print(f"threads {torch.get_num_threads()}, CPU variant {current().variant}")
    steps = {"decode b=1": [SeqChunk(0, 5, [1])], "decode b=8": [SeqChunk(s, 5, [1]) for s in range(8)],
             "prompt 512": [SeqChunk(0, 0, [1] * 512)]}
    for label, chunks in steps.items():
        for name, ops in (("C kernel", kernels), ("torch reference", reference)):
            state = RecurrentState(r, 8)
            proj = torch.randn(sum(len(c.tokens) for c in chunks), r.proj_dim, generator=gen)
            reps = 3 if proj.shape[0] > 1 else 50
            with torch.inference_mode():
                ms = 0.0
                for rep in range(reps + 1):   # the first warms up; each a forward (`stepping`) from where it stands
                    b = Batch.build([SeqChunk(c.stream, state.absorbed[c.stream] if c.start else 0, c.tokens)
                                     for c in chunks])
                    with state.stepping(b.attn):
                        t0 = time.perf_counter()
                        params.run(spec, proj, b, state, 0, ops)
                        ms += (time.perf_counter() - t0) * 1e3 if rep else 0.0
                ms /= reps
            print(f"{label:12s} {name:16s} {ms:8.2f} ms a layer, {ms * LAYERS:8.1f} ms for {LAYERS} layers")


if __name__ == "__main__":
    main()
