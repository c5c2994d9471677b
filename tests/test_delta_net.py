"""model/delta_net.py's two forms of the gated delta rule: the chunked (WY) form a prompt of
CHUNKED_FROM tokens or more runs gives the token loop's outputs and final state, from a state
already holding earlier tokens, at weak and strong decays (where the chunked form's e^x floor
applies) and across chunk boundaries."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from slotserver.model.delta_net import CHUNK, CHUNKED_FROM, _chunked, _step


def _inputs(n: int, decay: float, seed: int, heads: int = 4, dk: int = 32, dv: int = 16):
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(n, heads, dk, generator=gen), dim=-1) / dk ** 0.5
    k = F.normalize(torch.randn(n, heads, dk, generator=gen), dim=-1)
    v = torch.randn(n, heads, dv, generator=gen)
    g = -decay * torch.rand(n, heads, generator=gen)             # log-decays, as softplus(.) * a
    b = torch.rand(n, heads, generator=gen)
    return torch.randn(heads, dk, dv, generator=gen) * 0.3, q, k, v, g, b


@pytest.mark.parametrize("n", [CHUNKED_FROM, CHUNK, CHUNK + 37, 3 * CHUNK])
@pytest.mark.parametrize("decay", [0.2, 8.0])
def test_the_chunked_form_gives_the_token_loops_outputs_and_state(n, decay):
    s0, q, k, v, g, b = _inputs(n, decay, seed=n)
    s_loop, s_chunk = s0.clone(), s0.clone()
    loop = torch.stack([_step(s_loop, q[t], k[t], v[t], g[t], b[t]) for t in range(n)])
    chunked = _chunked(s_chunk, q, k, v, g, b)
    assert chunked.shape == loop.shape
    assert (chunked - loop).abs().max() < 2e-5 * loop.abs().max()
    assert (s_chunk - s_loop).abs().max() < 2e-5 * s_loop.abs().max()


def test_a_chunked_prompt_continued_token_by_token_is_one_recurrence():
    """The state the chunked form leaves is the one the next (decode) tokens continue from."""
    s0, q, k, v, g, b = _inputs(CHUNK + 5, 1.0, seed=3)
    s_loop, s_mixed = s0.clone(), s0.clone()
    loop = torch.stack([_step(s_loop, q[t], k[t], v[t], g[t], b[t]) for t in range(CHUNK + 5)])
    head = _chunked(s_mixed, q[:CHUNK], k[:CHUNK], v[:CHUNK], g[:CHUNK], b[:CHUNK])
    tail = torch.stack([_step(s_mixed, q[t], k[t], v[t], g[t], b[t]) for t in range(CHUNK, CHUNK + 5)])
    assert (torch.cat([head, tail]) - loop).abs().max() < 2e-5 * loop.abs().max()
