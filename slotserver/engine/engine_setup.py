"""What an Engine builds from its config and model bundle before its first step (engine.py): the KV
cache in its layout (and a hybrid model's recurrent states), the --cache-disk store, the thread
count the tuner starts from, and the speculator of --spec-type.
"""

from __future__ import annotations

from pathlib import Path

import torch

from slotserver.engine import recurrent_policy
from slotserver.engine.config import EngineConfig
from slotserver.engine.disk_cache import DiskCache, model_key
from slotserver.engine.kv_cache import KVCache
from slotserver.engine.speculative.speculator import Speculator, make_drafters
from slotserver.model.bundle import ModelBundle
from slotserver.runtime import native
from slotserver.runtime.kv_spec import KVSpec
from slotserver.runtime.recurrent_state import recurrent_state

_CACHE_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def kv_dtype(config: EngineConfig, bundle: ModelBundle) -> torch.dtype:
    """The cache's element type: `config.cache_type`, auto resolved as EngineConfig says."""
    if config.cache_type != "auto":
        return _CACHE_DTYPES[config.cache_type]
    return torch.float16 if bundle.config.dtype == "auto" else bundle.model.dtype


def disk_cache(config: EngineConfig, bundle: ModelBundle, spec: KVSpec) -> DiskCache:
    """--cache-disk's store for this model file, KV type and geometry (engine/disk_cache.py)."""
    key = model_key(Path(bundle.config.model_path), spec.dtype, (spec.n_layers, spec.n_kv_heads, spec.head_dim))
    limit = config.cache_disk_mib << 20 if config.cache_disk_mib > 0 else -1
    return DiskCache(Path(config.cache_disk), limit, key, spec.dtype)


def kv_cache(config: EngineConfig, bundle: ModelBundle) -> KVCache:
    """The KV cache of the model's attention layers in the configured layout; for a hybrid model also
    its recurrent states, made now: memory they need is found missing at start, not at a first request."""
    s = bundle.model.spec
    spec = KVSpec(s.n_kv_layers, config.n_streams, config.n_cells, s.n_kv_heads, s.head_dim, kv_dtype(config, bundle),
                  pool_cells=config.kv_pool_cells,   # paged: requests wait for free blocks past it
                  device=bundle.model.device)
    cache = KVCache.create(bundle.config.layout, spec, bundle.config.layouts_dir)
    cache.max_checkpoints = config.ctx_checkpoints   # a hybrid model's state copies (--ctx-checkpoints)
    if s.recurrent is not None:
        recurrent_state(cache, s.recurrent)
    return cache


def tuned_threads(config: EngineConfig, bundle: ModelBundle) -> int:
    """The thread count the tuner may lower to one (engine/thread_tuner.py); 1 turns it off: a GPU,
    `-t 1`, `--adaptive-threads off`, and `--tp` (rank 0's forward waits for the other ranks, whose
    counts it does not set: fewer threads there would only unbalance the ranks), and without the C
    kernels (no compiler, SLOTSERVER_NATIVE=0, or one that failed to build here: native.unavailable()):
    the torch formulations' floats follow the thread count (GGUF blocks at -t 1 and 2 differ), and a
    switch must change no answer."""
    if config.adaptive_threads == "off" or bundle.model.device != "cpu" or bundle.model.step_hook is not None \
            or not native.enabled() or native.unavailable():
        return 1
    return torch.get_num_threads()


def speculator(config: EngineConfig, bundle: ModelBundle, draft: ModelBundle | None) -> Speculator:
    """The drafters `config.spec` names; a draft model of another vocabulary is refused here."""
    if draft is not None:
        from slotserver.engine.speculative.draft_model import check_vocabulary
        recurrent_policy.refuse_draft(draft.model)
        check_vocabulary(bundle, draft)
    drafters = make_drafters(config.spec, draft, config.n_parallel, config.n_cells, kv_dtype(config, bundle)) \
        if config.spec.enabled else []
    return Speculator(config.spec, config.n_cells, bundle.model.spec.vocab_size, drafters)
