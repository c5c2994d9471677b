"""Where the engine computes: `--device auto|cpu|cuda`, resolved once at load.

`auto` takes the GPU when torch sees one, as llama.cpp offloads by default; `cuda` without one is
an error at startup, never a silent fall back to the CPU. What a device implies is decided here
and nowhere else:
- the kernels' implementation the KernelSet binds: `cpu` (C / torch) on the CPU, `triton` on CUDA;
- the matmul weights: the GGUF blocks (qmatmul) on the CPU; on CUDA `--gpu-weights`
  (model/gpu_weights.py): dequantized at load to the compute dtype for cuBLAS (`dense`), or the
  blocks kept on the card for kernels/qmatmul_gpu.py (`blocks`), `auto` by the card's free memory;
- the step graphs: the CPU replays its own C step graphs (model/step_graph.py), CUDA a captured
  CUDA graph per decode batch size and context bucket (model/cuda_graph.py);
- the lab's validation sandbox: a fork on the CPU; on CUDA a thread, since CUDA cannot be used in a
  forked child.
"""

from __future__ import annotations

import torch

from slotserver.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> str:
    """`auto` -> "cuda" when torch sees a CUDA device, else "cpu"; "cuda" without one: ConfigError."""
    if name not in DEVICES:
        raise ConfigError(f"--device must be one of {', '.join(DEVICES)}, got {name!r}")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: torch sees no CUDA device (torch "
                          f"{torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); use --device cpu")
    return name


def kernel_impl(device: str) -> str:
    """The kernel implementation a resolved device runs: `triton` on CUDA, `cpu` elsewhere."""
    return "triton" if device == "cuda" else "cpu"


def describe(device: str) -> str:
    """A short human name for /props, /lab and `top`: "cpu", or "cuda:0 (NVIDIA H100 80GB HBM3)"."""
    if device != "cuda":
        return device
    return f"cuda:{torch.cuda.current_device()} ({torch.cuda.get_device_name()})"


def upload(host: torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """A small host tensor's copy on `device`, queued behind the kernels already launched rather
    than waiting for them: on CUDA from pinned memory (torch's caching host allocator: no
    cudaHostAlloc per step) without a sync, since a blocking copy from pageable memory waits for
    every queued kernel (an overlapped engine's step in flight); elsewhere `.to(device)`."""
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
