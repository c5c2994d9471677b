"""Everything loaded from one GGUF file: model, tokenizer and chat template, ready to run."""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass

import torch

from slotserver.model.text.chat_template import ChatTemplate
from slotserver.model.config import ModelConfig
from slotserver.model.gguf_file import GGUFError, GGUFFile
from slotserver.model import gpu_weights
from slotserver.runtime import cpu_features
from slotserver.runtime.device import kernel_impl
from slotserver.runtime.kernel_set import KernelSet
from slotserver.model.model import LlamaModel
from slotserver.model.control_vector import load_control
from slotserver.model.lora import LoraSet, read_adapter
from slotserver.model.metadata_overrides import apply_overrides
from slotserver.model.read_weights import read_weights
from slotserver.model.spec import ModelSpec
from slotserver.model.text.tokenizer import Tokenizer
from slotserver.model.progress import stage
from slotserver.model.weights import Progress

log = logging.getLogger("slotserver.load")


@dataclass
class ModelBundle:
    config: ModelConfig
    model: LlamaModel
    tokenizer: Tokenizer
    template: ChatTemplate
    metadata: dict

    @classmethod
    def load(cls, config: ModelConfig, progress: Progress | None = None, check_tensors: bool = False,
             embedding: bool = False) -> "ModelBundle":
        """Open and validate the file (every tensor's data too with `check_tensors`), build the
        tokenizer first (cheap, fails early), then weights. An embedding model (gemma-embedding:
        attention both ways) loads only for embeddings (`embedding`: encoder/embedder.py)."""
        torch.set_num_threads(config.threads or cpu_features.physical_cores())   # -t 0: llama.cpp's default
        f = GGUFFile.open(config.model_path)
        apply_overrides(f.path, f.metadata, config.kv_overrides)   # --override-kv, before any reader
        if check_tensors:
            with stage("checking every tensor's data for NaN/inf (--check-tensors)", "tensor data checked"):
                f.check_tensors()
        spec = ModelSpec.from_gguf(f, config.rope_flags)
        if config.rope_flags.any:
            log.info("rope from the command line: %s (training context %d)", config.rope_flags.shown(), spec.ctx_train)
        if spec.bidirectional and not embedding:
            raise GGUFError(f"{f.path}: {spec.arch} is an embedding model, it generates no text: serve it with "
                            "`slotserver serve --embedding`")
        log.info("%s: %s, %d layers, d_model %d, %d-token vocabulary", config.model_path.name, spec.arch,
                 spec.n_layers, spec.d_model, spec.vocab_size)
        tokenizer = Tokenizer.from_metadata(f.metadata)
        template = ChatTemplate.from_metadata(f.metadata, tokenizer)
        device = config.resolved_device
        config = gpu_weights.resolve(config, f)   # --gpu-weights auto: dense or blocks, by the card's free memory
        kernels = KernelSet.load(config.kernels_dir, impl=kernel_impl(device))
        with stage(f"reading weights ({config.weight_format.kind}, {str(config.torch_dtype).removeprefix('torch.')}, {device})",
                   "weights read"):
            model = LlamaModel.from_file(f, spec, config.torch_dtype, kernels, config.max_ctx or None, progress,
                                         config.weight_format, device)
        if config.lora:   # --lora: the adapters' deltas, on the weights' device (model/lora.py)
            with stage(f"reading {len(config.lora)} LoRA adapter(s)", "LoRA adapters read"):
                arch = str(f.metadata.get("general.architecture", ""))
                model.lora = LoraSet([read_adapter(p, spec, arch) for p, _ in config.lora], spec, device)
        model.control = load_control(config.control_vectors, config.control_layers, spec.n_layers, spec.d_model,
                                     device)   # --control-vector: before any step graph is captured
        model.fused_gemv = config.fused_gemv   # model/gemv_step.py: CUDA decode steps on fused GEMVs
        model.set_step_graphs(config.replays_step_graphs)
        return cls(config, model, tokenizer, template, _without_vocabulary(f.metadata))


    # --sleep-idle-seconds: the weights go while the server sleeps, the rest (tokenizer, template,
    # spec, kernels, config) stays, so /props and the tokenizer routes answer without waking it
    def drop_weights(self) -> None:
        """Release the matmul weights (and the step graphs that hold their buffers)."""
        self.model.weights = None
        self.model.set_step_graphs(False)
        gc.collect()

    def reload_weights(self) -> None:
        """Read the weights again as `load` did (same format, dtype, device), then warm them up."""
        cfg, model = self.config, self.model
        model.weights = read_weights(GGUFFile.open(cfg.model_path), model.spec, model.dtype, model.kernels,
                                     cfg.weight_format, model.device)
        model.set_step_graphs(cfg.replays_step_graphs)
        model.warm_up()


# The vocabulary arrays, read once by the tokenizer: kept as Python lists they held ~13 MiB of a
# 151k-token model's RSS for nothing (the tokenizer has its own tables).
_VOCABULARY = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")


def _without_vocabulary(md: dict) -> dict:
    return {k: v for k, v in md.items() if k not in _VOCABULARY}
