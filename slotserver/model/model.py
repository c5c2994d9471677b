"""The decoder-only transformer of every supported architecture: one forward per step over a ragged batch.

No Python loop over sequences inside the layers: every layer runs its matmuls on all `[tokens]`
rows of the batch at once, writes the new K/V rows into the layout, and calls the attention kernel
once with the batch's `AttnMeta` (carrying the layer's sliding window and softcap). Ops come from
a `KernelSet` (swappable at step boundaries).

One flat forward, no class per architecture: the `ModelSpec` switches (see archs.py's ARCHS) turn
on what an architecture adds to the llama block: the embedding scale (gemma, granite), per-head
q/k RMSNorm (qwen3, gemma3), per-layer rope tables and windows (gemma2/3), post-attention and
post-FFN norms (gemma2/3), a GELU instead of SiLU gate (gemma), residual and logit multipliers
(granite), final-logit soft-capping (gemma2), and a mixture-of-experts FFN (qwen3moe, qwen2moe,
olmoe, granitemoe: moe.py) with olmoe's q/k norms over the whole projection, smollm3's unrotated
layers (an identity rope table), mistral3's q temperature past the trained context, olmo2's
branches without pre-norms, the hybrids' recurrent layers in place of attention (their `qkv` the
in-projection, `recurrent.run` the layer: recurrent_layer.py) and nemotron_h's one-block layers (a
mixer alone, or an FFN alone: ffn_layer.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from slotserver.runtime.batch import Batch
from slotserver.model.gguf_file import GGUFError, GGUFFile
from slotserver.model.tensor_table import EMBEDDER_HEADS, unread_problem
from slotserver.model.recurrent_spec import mtp_tensors
from slotserver.runtime.recurrent_state import recurrent_state
from slotserver.runtime.kernel_set import KernelSet
from slotserver.model.metadata_overrides import apply_overrides
from slotserver.model.rope_scaling import RopeFlags
from slotserver.model.spec import ModelSpec
from slotserver.model.rope_table import RopeTable
from slotserver.model.step_graph import StepGraphs
from slotserver.model.cuda_graph import CudaGraphs
from slotserver.model import gemv_step, heap, lean_step, step_replay
from slotserver.model.attention_branch import attention, q_temperature
from slotserver.model.block_ops import BlockOps, as_dtype
from slotserver.model.bias_add import add_bias
from slotserver.model.scaled_add import scale_rows, scaled_add
from slotserver.model.relu_sqr import relu_sqr
from slotserver.model.linear import QLinear
from slotserver.model import lora_delta
from slotserver.model.lora import LoraSet
from slotserver.model.moe import moe_ffn
from slotserver.model.read_weights import check_kernels, read_weights
from slotserver.model.weights import LayerWeights, ModelWeights, Progress, WeightFormat


@dataclass
class LlamaModel(BlockOps):
    spec: ModelSpec
    weights: ModelWeights
    kernels: KernelSet
    rope: RopeTable            # the full-attention layers' table (its max_pos bounds the context)
    dtype: torch.dtype
    path: Path | None = None
    layer_ropes: list[RopeTable] = field(default_factory=list)  # per layer (windowed layers: their own)
    # --tp's rank 0 (slotserver/parallel/leader.py): called with (batch, cache) before each forward,
    # to send the step to the other ranks, which run the same forward on their shards
    step_hook: Callable[[Batch, object], None] | None = None
    # decode steps of few rows on the fused GEMV kernels (gemv_step.py; ModelConfig.fused_gemv): off,
    # as an H200 measured it slower than cuBLAS but at one row of a 0.5B model. Set at load: a change after
    # CUDA graphs were captured needs set_step_graphs(True) to recapture them
    fused_gemv: bool = False
    # LoRA adapters (model/lora.py; `--lora`): applied to the rows of a batch that carry scales
    lora: LoraSet | None = None
    # control vectors (model/control_vector.py; `--control-vector`): {layer: float32 [d_model]} added
    # to that layer's output; set at load, before any step graph is captured
    control: dict[int, torch.Tensor] | None = None

    def __post_init__(self) -> None:
        if not self.layer_ropes:
            self.layer_ropes = [self.rope] * self.spec.n_layers
        # no post-norms and no residual scale: branch outputs are added as they are (llama, qwen)
        self._plain = self.spec.residual_scale == 1.0 and all(
            lw.post_attn_norm is None and lw.post_ffn_norm is None for lw in self.weights.layers)
        self._device = self.weights.out_norm.device.type   # kept while the weights are dropped (sleep)
        self.graphs: StepGraphs | CudaGraphs | None = step_replay.new_graphs(self)

    @property
    def device(self) -> str:
        """Where the weights live and the forward runs: "cpu" or "cuda" (runtime/device.py)."""
        return self._device

    @classmethod
    def load(cls, path: str | Path, dtype: torch.dtype = torch.float32,
             kernels: KernelSet | None = None, max_pos: int | None = None,
             progress: Progress | None = None, fmt: WeightFormat = WeightFormat(),
             rope_flags: RopeFlags = RopeFlags(), kv_overrides: tuple[tuple[str, object], ...] = ()) -> "LlamaModel":
        f = GGUFFile.open(path)
        apply_overrides(f.path, f.metadata, kv_overrides)   # --override-kv (model/metadata_overrides.py)
        return cls.from_file(f, ModelSpec.from_gguf(f, rope_flags), dtype, kernels, max_pos, progress, fmt)

    @classmethod
    def from_file(cls, f: GGUFFile, spec: ModelSpec, dtype: torch.dtype,
                  kernels: KernelSet | None = None, max_pos: int | None = None,
                  progress: Progress | None = None, fmt: WeightFormat = WeightFormat(),
                  device: str = "cpu") -> "LlamaModel":
        """device: where the weights and rope tables live (runtime/device.py; kernels bound to match)."""
        kernels = kernels or KernelSet.load()
        check_kernels(f, spec, kernels)
        if spec.mla is not None and device != "cpu":   # a real deepseek2's 576-wide row: past the Triton tiles
            raise GGUFError(f"{f.path}: {spec.arch}'s latent attention runs on the CPU for now (--device cpu): its "
                            f"{spec.head_dim}-wide cache row is past the Triton attention kernels' tiles (256)")
        weights = read_weights(f, spec, dtype, kernels, fmt, device, progress)
        if (problem := unread_problem(f.tensors, spec.arch, EMBEDDER_HEADS | mtp_tensors(f.tensors, spec))) is not None:
            raise GGUFError(f"{f.path}: {problem}")
        max_pos = max_pos or spec.ctx_train
        # phi3 longrope: the long factors once the context passes the trained one (llama.cpp's choice)
        long = weights.rope_long is not None and max_pos > spec.rope.file_ctx
        freqs = weights.rope_long if long else weights.rope_freqs
        tables: dict[tuple[float, float, bool, bool], RopeTable] = {}
        for params in map(spec.rope_params, range(spec.n_layers)):
            if params not in tables:
                tables[params] = RopeTable(spec, max_pos, freqs, device, *params)
        layer_ropes = [tables[spec.rope_params(i)] for i in range(spec.n_layers)]
        full = tables.get((spec.rope_base, spec.rope_scale, True, True)) or layer_ropes[0]
        heap.keep_freed_memory()   # after loading: what the load freed goes back to the system
        return cls(spec, weights, kernels, full, dtype, f.path, layer_ropes)

    @torch.inference_mode()
    def forward(self, batch: Batch, cache, logits_into: torch.Tensor | None = None) -> torch.Tensor:
        """Run the batch, writing its K/V into `cache` (and a hybrid model's recurrent states, kept
        as `cache.recurrent`: runtime/recurrent_state.py); -> float32 logits `[len(logits_rows), vocab]`."""
        if self.spec.recurrent is None:
            return self._forward(batch, cache, logits_into)
        with recurrent_state(cache, self.spec.recurrent).stepping(batch.attn):
            return self._forward(batch, cache, logits_into)

    def _forward(self, batch: Batch, cache, logits_into: torch.Tensor | None = None) -> torch.Tensor:
        """forward's body: logits of the batch.
        A decode-only batch replays its step graph where one was captured (step_replay.py).

        logits_into: a float32 `[>= rows, vocab]` buffer the caller reuses from step to step (the
        engine: it samples before the next forward); the logits are then its first rows, valid until
        it is written again. Why: 32 rows of a 262k vocabulary are 33.5 MB, above glibc's mmap
        threshold, so a fresh tensor was a fresh mapping every step, each page faulted and zeroed
        by the kernel: 8 of gemma3-270m's 48 ms at batch 32 (AVX-512 Zen 5 host)."""
        if batch.attn.max_kv > self.rope.max_pos:   # on the host: a device index past the table would abort
            raise ValueError(f"position {batch.attn.max_kv - 1} beyond the rope table ({self.rope.max_pos})")
        if self.step_hook is not None:
            self.step_hook(batch, cache)
        if self._q_temp(batch):   # mistral3 past its trained context: q scaled per position, eagerly
            return self._body(*self._inputs(batch), batch, cache, logits_into)
        if self._adapted(batch) and not lora_delta.serves(batch.n_tokens, batch.tokens.is_cpu):
            return self._body(*self._inputs(batch), batch, cache, logits_into)   # torch's deltas: eager
        return step_replay.replayed(self, batch, cache, logits_into)   # a graph's, or the layers as usual

    def _adapted(self, batch: Batch) -> bool:
        """Whether LoRA deltas apply to this batch: adapters loaded and some row has a scale. Up to
        lora_delta.MAX_ROWS CPU rows they are C calls after the usual (fused) matmuls, and the step
        may be a step graph; else the unfused body adds torch's deltas to the matmuls' outputs."""
        return batch.lora is not None and self.lora is not None

    def _q_temp(self, batch: Batch) -> bool:
        """Whether some position of the batch has a q temperature other than 1 (mistral3's
        `attention.temperature_scale`: positions past rope.file_ctx). Such a step runs the plain
        body with the scale in attention_branch.py; below that context the scale is exactly 1, so every
        step graph and fused body serves as for llama."""
        return bool(self.spec.attn_temp_scale) and batch.attn.max_kv > self.spec.rope.file_ctx

    def _inputs(self, batch: Batch) -> tuple[torch.Tensor, dict[int, tuple[torch.Tensor, torch.Tensor]]]:
        """The embedded tokens (the residual, f32) and each distinct rope table's cos, sin of the positions."""
        tables = {id(t): t for t in self.layer_ropes}            # one lookup per distinct table
        angles = {k: t.lookup(batch.positions) for k, t in tables.items()}  # cos, sin [tokens, rope_dim/2]
        x = self.weights.embed(batch.tokens)                     # [tokens, d_model] residual in f32
        if self.spec.embed_scale != 1.0:
            x = x * self.spec.embed_scale
        return x, angles

    def _body(self, x: torch.Tensor, angles: dict, batch: Batch, cache,
              logits_into: torch.Tensor | None = None) -> torch.Tensor:
        """The layers, the final norm and the output matmul on the embedded batch `x` (updated in place)."""
        s, w, ops = self.spec, self.weights, self.kernels
        act = w.act_dtype
        lora = batch.lora if self._adapted(batch) else None   # [T, adapters]
        in_c = lora is not None and lora_delta.serves(batch.n_tokens, x.is_cpu)   # else torch's, on x unfused
        fuse = (lora is None or in_c) and ops.fuses.get("qmatmul", frozenset()) >= {"norm", "glu", "acc"}
        lora = lora if lora is None else (lora, in_c)
        temp = q_temperature(self, batch)                   # [tokens] float32, or None (mistral3)
        lean = lora is None and lean_step.applies(self, ops) and temp is None and self.control is None
        if lean:   # the Triton kernels: fewer launches (lean_step.py, gemv_step.py)
            body = gemv_step.gemv_body if gemv_step.applies(self, ops, batch) else lean_step.lean_body
            return self._logits(fuse, body(self, x, angles, batch, cache), logits_into)
        norm_adds = "acc" in ops.fuses.get("rms_norm", ()) and s.residual_scale == 1.0   # x += post_norm(y) in C
        for i, lw in enumerate(w.layers):
            x = self._layer(i, lw, x, batch, cache, angles, temp, fuse, norm_adds, lora)
            if self.control is not None and i in self.control:   # --control-vector: after layer i's output
                x = add_bias(x, self.control[i])
        every = batch.logits_rows.shape[0] == batch.n_tokens
        rows = x if every else x[batch.logits_rows]                          # all rows, in order
        out_lora = None if lora is None else (-1, "output", lora if every else (lora[0][batch.logits_rows], lora[1]))
        return self._logits(fuse, as_dtype(ops.rms_norm(rows, w.out_norm, s.norm_eps), act), logits_into, out_lora)

    def _layer(self, i: int, lw: LayerWeights, x: torch.Tensor, batch: Batch, cache, angles: dict,
               temp: torch.Tensor | None, fuse: bool, norm_adds: bool, lora) -> torch.Tensor:
        """x after layer i: its mixer (attention or recurrent), then its FFN or experts, each added."""
        s, ops = self.spec, self.kernels
        if lw.qkv is not None:   # (nemotron_h's FFN-only layers have no mixer)
            x = self._mixer(i, lw, x, batch, cache, angles, temp, fuse, norm_adds, lora)
        if lw.moe is not None:
            return self._moe(lw, x, self._plain)
        if lw.gate_up is None:   # a mixer alone (nemotron_h)
            return x
        gate_up = self._mm(fuse, lw.gate_up, x, norm=lw.ffn_norm, lora=(i, "gate_up", lora))  # [tokens, 2 ff]
        if s.act == "gelu":
            gate_up = ops.gelu_mul(gate_up)
        elif s.act == "relu2":   # nemotron_h: up alone, squared ReLU ([tokens, ff])
            gate_up = relu_sqr(gate_up)
        down, silu = (i, "down", lora), s.act == "silu"
        if self._plain:
            return self._mm(fuse, lw.down, gate_up, glu=silu, acc=x, lora=down)
        return self._residual_add(norm_adds, x, self._mm(fuse, lw.down, gate_up, glu=silu, lora=down),
                                  lw.post_ffn_norm)

    def _mixer(self, i: int, lw: LayerWeights, x: torch.Tensor, batch: Batch, cache, angles: dict,
               temp: torch.Tensor | None, fuse: bool, norm_adds: bool, lora) -> torch.Tensor:
        """x + layer i's attention, or a hybrid's recurrent layer (its qkv the in-projection); with
        falcon-h1's Mamba-2 mixer beside the attention, x + (attention + mixer), as llama.cpp adds."""
        s, w = self.spec, self.weights
        qkv = self._mm(fuse, lw.qkv, x, norm=lw.attn_norm, lora=(i, "qkv", lora))  # [tokens, q + 2 kv]
        if lw.recurrent is not None:
            a = as_dtype(lw.recurrent.run(s, qkv, batch, cache.recurrent, i, self.kernels), w.act_dtype)
        else:
            a = attention(self, i, lw, qkv, batch, cache, *angles[id(self.layer_ropes[i])], temp)
        if lw.parallel is not None:   # (falcon-h1 has no post-norms or residual scale)
            p = lw.parallel
            proj = self._mm(fuse, p.qkv, x, norm=p.attn_norm)                   # [tokens, z | xBC | dt]
            y = as_dtype(p.recurrent.run(s, proj, batch, cache.recurrent, i, self.kernels), w.act_dtype)
            attn = as_dtype(self._mm(fuse, lw.wo, a), torch.float32)   # the sum in float32, as llama.cpp's
            return scaled_add(x, scaled_add(attn, self._mm(fuse, p.wo, y), 1.0), 1.0)
        if self._plain:
            return self._mm(fuse, lw.wo, a, acc=x, lora=(i, "wo", lora))   # x += a @ wo^T
        return self._residual_add(norm_adds, x, self._mm(False, lw.wo, a, lora=(i, "wo", lora)), lw.post_attn_norm)

    def _logits(self, fuse: bool, x: torch.Tensor, logits_into: torch.Tensor | None,
                lora: tuple | None = None) -> torch.Tensor:
        """The output matmul on the output-normed rows x ([rows, d_model]), scaled and soft-capped;
        lora: (-1, "output", (row scales, in C)) where the batch has LoRA rows (see `_mm`)."""
        s, w = self.spec, self.weights
        if logits_into is None:
            logits = self._mm(False, w.output, x, lora=lora).float()   # [rows, vocab], a new tensor
        else:                                                    # added into zeros: the same floats
            logits = self._mm(fuse, w.output, x, acc=logits_into[: x.shape[0]].zero_(), lora=lora)
        if s.logit_scale != 1.0:   # granite: times 1 / logit_scale, as llama.cpp's ggml_scale
            logits = scale_rows(logits, 1.0 / s.logit_scale)
        if s.final_softcap:
            logits.div_(s.final_softcap).tanh_().mul_(s.final_softcap)
        return logits

    def _moe(self, lw: LayerWeights, x: torch.Tensor, plain: bool) -> torch.Tensor:
        """x + a MoE layer's FFN output (moe.py): the routed experts on the normed rows, plus the
        shared expert's FFN where the layer has one; added into x in C where the branch is plain."""
        ops = self.kernels
        h = as_dtype(ops.rms_norm(x, lw.ffn_norm, self.spec.norm_eps), self.weights.act_dtype)   # [tokens, d_model]
        shared, activate = None, (relu_sqr if self.spec.act == "relu2" else ops.silu_mul)   # nemotron_h_moe: ungated
        if lw.gate_up is not None:
            shared = lambda h: lw.down(activate(lw.gate_up(h, ops)), ops)    # noqa: E731
        if plain and x.dtype == torch.float32:
            return moe_ffn(ops, self.spec.moe, lw.moe, h, shared, acc=x)
        out = moe_ffn(ops, self.spec.moe, lw.moe, h, shared).to(x.dtype)
        return self._residual_add(False, x, out, lw.post_ffn_norm)

    def set_step_graphs(self, on: bool) -> None:
        """Replay captured decode steps (step_graph.py; the default), or run every step as usual."""
        self.graphs = step_replay.new_graphs(self) if on else None

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Each GGUF-block matmul once on two rows of zeros, as llama-server's warmup run before it
        reports healthy: qmatmul builds a weight's repacked form on its first call, which otherwise
        lands in the first request's time to first token (measured: SmolLM2 Q4_1 0.11 s, gemma3-270m
        Q4_K_M 0.30 s)."""
        for lin in self.weights.matmuls():
            lin = getattr(lin, "lin", lin)   # --tp's row- and vocabulary-parallel wrappers (slotserver/parallel)
            for p in lin.parts if isinstance(lin, QLinear) else ():
                getattr(self.kernels, lin.op)(torch.zeros(2, p.k, dtype=self.weights.act_dtype, device=p.raw.device), p)
        one = torch.zeros(1, 1, dtype=torch.int64)
        for e in self.weights.experts():   # moe_matmul repacks every expert on its first call
            self.kernels.moe_matmul(torch.zeros(1, e.k, dtype=self.weights.act_dtype), e, one)
