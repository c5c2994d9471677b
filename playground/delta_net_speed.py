"""Time model/delta_net.py alone at Qwen3.5-0.8B's delta-net shapes (16 q/k and 16 v heads of 128,
convolution width 4, 18 of its 24 layers recurrent): decode steps of 1 and 8 sequences and one
512-token prefill chunk (the chunked form, then the token loop it replaces: CHUNKED_FROM raised),
per layer and for the 18 layers. The in/out projections are not timed
(plain matmuls like any layer's). Run: .venv/bin/python playground/delta_net_speed.py
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from slotserver.model import delta_net as dn
from slotserver.model.delta_net import delta_net
from slotserver.model.delta_net import GdnParams
from slotserver.model.recurrent_spec import RecurrentSpec
from slotserver.runtime.batch import Batch, SeqChunk
from slotserver.runtime.recurrent_state import RecurrentState

LAYERS = 18


def main() -> None:
    r = RecurrentSpec(d_conv=4, n_k_heads=16, n_v_heads=16, head_k=128, head_v=128, layers=(True,))
    spec, gen = SimpleNamespace(recurrent=r), torch.Generator().manual_seed(0)
    params = GdnParams(conv=torch.randn(r.conv_dim, 4, generator=gen) * 0.3, dt_bias=torch.rand(16, generator=gen),
                       a=-torch.rand(16, generator=gen) - 0.5, norm=torch.ones(128))
    print(f"threads {torch.get_num_threads()}")
    cases = (("decode b=1", [SeqChunk(0, 5, [1])]), ("decode b=8", [SeqChunk(s, 5, [1]) for s in range(8)]),
             ("prefill 512", [SeqChunk(0, 0, [1] * 512)]), ("prefill 512, token loop", [SeqChunk(0, 0, [1] * 512)]))
    chunked_from = dn.CHUNKED_FROM
    for label, chunks in cases:
        dn.CHUNKED_FROM = 1 << 30 if "token loop" in label else chunked_from
        batch = Batch.build(chunks)
        state = RecurrentState(r, 8)
        proj = torch.randn(batch.n_tokens, r.proj_dim, generator=gen)
        reps = 3 if batch.n_tokens > 1 else 50
        with torch.inference_mode():
            ms = 0.0
            for rep in range(reps + 1):   # the first warms up; each a forward (`stepping`) from where it stands
                chunks_now = [SeqChunk(c.stream, state.absorbed[c.stream] if c.start else 0, c.tokens) for c in chunks]
                b = Batch.build(chunks_now)
                with state.stepping(b.attn):
                    t0 = time.perf_counter()
                    delta_net(spec, params, proj, b, state, 0, 1e-6)
                    ms += (time.perf_counter() - t0) * 1e3 if rep else 0.0
            ms /= reps
        print(f"{label:24s} {ms:8.2f} ms a layer, {ms * LAYERS:8.1f} ms for {LAYERS} layers")


if __name__ == "__main__":
    main()
