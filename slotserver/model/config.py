"""Explicit, validated configuration of what to load and how to run it. No module globals."""

from __future__ import annotations

import math

from dataclasses import dataclass
from pathlib import Path

import torch

from slotserver.errors import ConfigError  # noqa: F401  re-export: defined without torch in slotserver.errors
from slotserver.runtime import cpu_features
from slotserver.model.rope_scaling import RopeFlags
from slotserver.runtime.device import resolve_device

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DTYPE_CHOICES = ("auto", *DTYPES)
WEIGHTS = ("auto", "q", "dense", "int8", "int4", "auto8", "auto4")   # slotserver.model.weights.WEIGHT_KINDS
GPU_WEIGHTS = ("auto", "dense", "blocks")   # --gpu-weights: see model/gpu_weights.py


# A kv head's cells contiguous: the C attention kernel's work unit is one (stream, kv head); decode
# attention at 8 sequences ~18% faster than seq_head_dim (docs/performance.md, "Fourth round")
DEFAULT_LAYOUT = "head_seq_dim"

def lora_flags(items: list[tuple[str, str]] | None, flag: str = "--lora-scaled") -> tuple[tuple[Path, float], ...]:
    """--lora FNAME[,FNAME] (scale 1) and --lora-scaled FNAME:SCALE[,...] as the CLI collects them
    (("", value) / (":", value), in command-line order: llama-server's adapter ids) -> (file, scale).
    The same for --control-vector / --control-vector-scaled (`flag` names the scaled one in errors)."""
    out = []
    for kind, value in items or []:
        for item in value.split(","):
            if not kind:
                out.append((Path(item), 1.0))
                continue
            name, _, scale = item.rpartition(":")
            try:
                value = float(scale) if name else None
            except ValueError:
                value = None
            if value is None:
                raise ConfigError(f"{flag} format: FNAME:SCALE, got {item!r}")
            out.append((Path(name), value))
    return tuple(out)


@dataclass(frozen=True)
class ModelConfig:
    model_path: Path
    # float32 + weights auto: the exact reference (what library callers and tests get); the CLI
    # passes its own default, `--dtype auto`: float32 with the GGUF blocks (weight_format), and
    # bfloat16 only for dequantized weights (--weights) on a CPU that computes bf16 natively
    dtype: str = "float32"
    threads: int = 0                 # 0: the physical cores (cpu_features.physical_cores), as llama.cpp
    layout: str = DEFAULT_LAYOUT
    kernels_dir: Path | None = None  # None: the repository's kernels/
    layouts_dir: Path | None = None  # None: the repository's layouts/
    max_ctx: int = 0                 # 0: the model's training context
    weights: str = "auto"            # auto: GGUF blocks + qmatmul (float32: exact dequantized); see WeightFormat
    step_graphs: bool = True         # replay captured decode steps (slotserver/model/step_graph.py)
    device: str = "cpu"              # auto | cpu | cuda (runtime/device.py); the CLI's default is auto
    gpu_weights: str = "auto"        # on CUDA: dense (bf16 + cuBLAS) | blocks (GGUF blocks + qmatmul_gpu) | auto
    # on CUDA, dense weights: decode steps of <= 16 rows on kernels/gemv.py's fused GEMVs instead of
    # cuBLAS + separate norm/rope/gate kernels (model/gemv_step.py); off: an H200 measured it faster
    # only at one row of a 0.5B model (1.10x), slower at 8-16 rows and at 8B widths (docs/gpu.md)
    fused_gemv: bool = False
    # LoRA adapters (model/lora.py): (file, scale) in id order (--lora FILE: 1.0, --lora-scaled
    # FILE:SCALE); lora_init_without_apply: every scale starts at 0 (POST /lora-adapters sets them)
    lora: tuple[tuple[Path, float], ...] = ()
    lora_init_without_apply: bool = False
    # llama-server's --rope-*/--yarn-* over the file's rope (model/rope_scaling.py) and --override-kv's
    # metadata values ((key, value) in order: model/metadata_overrides.py)
    rope_flags: RopeFlags = RopeFlags()
    kv_overrides: tuple[tuple[str, object], ...] = ()
    # --control-vector(-scaled): (file, scale) summed; --control-vector-layer-range (first, last) or None
    control_vectors: tuple[tuple[Path, float], ...] = ()
    control_layers: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_CHOICES:
            raise ConfigError(f"--dtype must be one of {', '.join(DTYPE_CHOICES)}, got {self.dtype!r}")
        if not isinstance(self.threads, int) or self.threads < 0:
            raise ConfigError(f"--threads must be >= 0, got {self.threads!r}")
        if not isinstance(self.max_ctx, int) or self.max_ctx < 0:
            raise ConfigError(f"context size must be >= 0, got {self.max_ctx!r}")
        if not isinstance(self.step_graphs, bool):
            raise ConfigError(f"step_graphs must be a bool, got {self.step_graphs!r}")
        if not isinstance(self.fused_gemv, bool):
            raise ConfigError(f"fused_gemv must be a bool, got {self.fused_gemv!r}")
        if self.weights not in WEIGHTS:
            raise ConfigError(f"--weights must be one of {', '.join(WEIGHTS)}, got {self.weights!r}")
        if self.gpu_weights not in GPU_WEIGHTS:
            raise ConfigError(f"--gpu-weights must be one of {', '.join(GPU_WEIGHTS)}, got {self.gpu_weights!r}")
        if resolve_device(self.device) == "cuda" and self.weights not in ("auto", "dense"):
            raise ConfigError(f"--weights {self.weights} is CPU-only; on --device cuda the weights are "
                              "dequantized at load (auto or dense)")
        try:
            cpu_features.current()   # SLOTSERVER_CPU: a typo is an error at startup, not at the first kernel build
        except cpu_features.CpuVariantError as e:
            raise ConfigError(str(e)) from None
        for path, scale in self.lora:
            if not Path(path).is_file():
                raise ConfigError(f"LoRA adapter {path}: no such file")
            if not math.isfinite(scale):
                raise ConfigError(f"LoRA adapter {path}: scale must be a finite number, got {scale}")
        for path, scale in self.control_vectors:
            if not Path(path).is_file():
                raise ConfigError(f"control vector {path}: no such file")
            if not math.isfinite(scale):
                raise ConfigError(f"control vector {path}: scale must be a finite number, got {scale}")
        if self.control_layers is not None and 0 < self.control_layers[1] < self.control_layers[0]:
            raise ConfigError(f"--control-vector-layer-range {self.control_layers[0]} {self.control_layers[1]}: "
                              "expected START <= END")
        for name in ("kernels_dir", "layouts_dir"):
            folder = getattr(self, name)
            if folder is not None and not Path(folder).is_dir():
                raise ConfigError(f"--{name.replace('_', '-')} {folder} is not a folder")

    @property
    def weight_format(self):
        """auto: with an explicit `--dtype float32` the exact dequantized weights (reference mode);
        everywhere else, on every CPU family, the GGUF blocks, mapped from the file, and the qmatmul
        kernels: batch-invariant, so a prompt's answer does not depend on what it was batched with.

        AMX hosts took auto4 for Q4_1 files until issue 32: its kernels change with the row count
        (torch int4 at 1-2 rows, the AMX tile kernel to 32, dense bf16 above), so 7 of 16 greedy
        texts under 8 concurrent clients differed from the same prompts alone, and it was slower
        where serving spends its time. Measured on a 2-core Sapphire-Rapids-class host (AMX,
        AVX-512 BF16/VNNI), SmolLM2-135M Q4_1, decode step b=1 / 8 / 32: auto4 11.8-13.1 /
        17.0-17.3 / 33.8-36.2 ms, blocks 2.9-3.0 / 8.8-10.0 / 19.4-20.5 ms; prefill of 32 x 16
        tokens auto4 134 ms, blocks 199-238 ms (AMX tiles win big prefills). `--weights auto4`
        keeps it on request."""
        from slotserver.model.weights import WeightFormat

        if self.weights == "auto":
            if self.resolved_device == "cuda":   # auto unresolved (before ModelBundle.load) reads as dense
                return WeightFormat("blocks" if self.gpu_weights == "blocks" else "dense")   # gpu_weights.py
            return WeightFormat("dense" if self.dtype == "float32" else "q")   # dense: the exact reference mode
        return WeightFormat(self.weights)  # row thresholds: measured defaults, see WeightFormat

    @property
    def resolved_device(self) -> str:
        """"cpu" or "cuda": `device` with auto resolved (runtime/device.py)."""
        return resolve_device(self.device)

    @property
    def replays_step_graphs(self) -> bool:
        """The CPU's C step graphs (model/step_graph.py), CUDA graphs on a GPU (model/cuda_graph.py)."""
        return self.step_graphs

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto" and self.resolved_device == "cuda":
            return torch.bfloat16   # every CUDA card we target computes bf16 natively (tensor cores)
        if self.dtype == "auto" and self.weight_format.kind == "q":
            return torch.float32   # see resolve_dtype: blocks compute on 8-bit activations anyway
        return DTYPES[resolve_dtype(self.dtype)]


def resolve_dtype(name: str, cpu: cpu_features.CpuFeatures | None = None) -> str:
    """auto -> bfloat16 only where the CPU computes bf16 natively (AVX512-BF16 or AMX, within the
    SLOTSERVER_CPU variant: never under avx2), else float32 (bf16 emulated by conversion is slower).

    With GGUF blocks (`--weights q`, the default) `ModelConfig.torch_dtype` keeps float32
    whatever the CPU: the matmuls quantize their inputs to 8 bits as llama.cpp does, so bf16 buys
    no matmul speed (measured: within 1% at 1 and 8 sequences, 7% at 32), while bf16 outputs, KV
    and residual branches moved SmolLM2's log-probabilities by up to 0.26 against the f32 run and
    changed greedy continuations between a cached and an uncached prompt (llama.cpp's server
    tests caught it). llama.cpp itself keeps activations in f32."""
    if name != "auto":
        return name
    cpu = cpu or cpu_features.current()
    return "bfloat16" if cpu.has("avx512_bf16") or cpu.amx else "float32"
