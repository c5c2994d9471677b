"""Re-rotating cached keys for a KV shift (context shift, cache reuse): llama.cpp's `seq_add` on K.

The cache stores K after RoPE: row p holds `R(p) k` (times the table's mscale). Moving that row to
position p + d must leave exactly what a forward at p + d would have stored, `R(p + d) k`. RoPE
is a rotation whose angle is linear in the position, for every variant this package loads (GGML
normal pairs, NEOX through the load-time q/k permutation, linear / yarn / longrope scaling,
llama3 frequency factors, partial rotary dims, gemma's per-layer tables), so `R(p + d) = R(d) R(p)`
and the shift is one more rotation by `d`, computed with the model's own tables
(`RopeTable.rotation`: the same angle formula as the forward's table) and its own `rope` kernel.
Nothing here writes a formula of its own. V carries no position: it moves unchanged.

Exactness: in float32 the shifted key differs from a freshly computed one by float rounding only
(one rotation more, ~1e-7 relative); a float16 / bfloat16 / q8 cache adds its own rounding when the
rotated row is stored back (one more rounding of the row, like any write).

Sliding-window layers (gemma2/3) are exact too: windows are measured on positions, and after a
shift cell index = position again. A model with `rope_dim == 0` has nothing to rotate.

One exception, kept because llama.cpp does the same: hunyuan-dense norms k *after* the rope
(`ModelSpec.qk_norm_late`), and a per-dimension norm weight does not commute with a rotation, so
its shifted key is `R(d) norm(R(p) k)`, not `norm(R(p + d) k)`; llama.cpp's shift re-rotates the
stored key the same way, so both servers serve the same shifted cache.
"""

from __future__ import annotations

import torch


def rotate_keys(model, k: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """k: [n_layers, n, kv_heads, head_dim] keys as stored (after RoPE); delta: [n] int position
    offsets. -> float32 keys as if computed at their positions + delta (a new tensor)."""
    out = k.float().clone()                                    # [n_layers, n, kv_heads, head_dim]
    if model.spec.rope_dim == 0 or k.shape[1] == 0:
        return out
    turns: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}   # one rotation per distinct table
    for i, table in enumerate(model.layer_ropes):
        if id(table) not in turns:
            turns[id(table)] = table.rotation(delta)           # cos, sin [n, rope_dim/2]
        cos, sin = turns[id(table)]
        out[i] = model.kernels.rope(out[i], cos, sin)          # [n, kv_heads, head_dim]
    return out


def shift_problem(model) -> str | None:
    """Why this model's cached keys cannot be moved to other positions, or None when they can."""
    if getattr(getattr(model, "spec", None), "recurrent", None) is not None:
        return "a hybrid model's recurrent layers hold one state per sequence, which cannot drop or move tokens"
    if not hasattr(model, "layer_ropes") or len(model.layer_ropes) != model.spec.n_layers:
        return f"the model ({type(model).__name__}) has no per-layer RoPE tables to re-rotate cached keys with"
    if not all(callable(getattr(t, "rotation", None)) for t in model.layer_ropes):
        return "the model's RoPE tables cannot rotate by a position offset"
    return None
