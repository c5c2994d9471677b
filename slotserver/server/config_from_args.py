"""`slotserver serve` arguments -> validated ServerConfig and LaunchPlan, before anything starts.

Everything checkable without loading the model is checked here, so a typo costs one line and exit
status 2 instead of a server that starts and then fails: numbers and ranges (through the config
dataclasses), the model file, key files, the chat template (compiled), unsupported features.
"""

from __future__ import annotations

import logging
from pathlib import Path

from slotserver.model import metadata_overrides
from slotserver.model.rope_scaling import RopeFlags
from slotserver.model.text.chat_template import BUILTIN_NAMES, ChatTemplate, named_template
from slotserver.model.config import ConfigError, ModelConfig, lora_flags
from slotserver.engine.speculative.config import SpecConfig
from slotserver.engine.config import EngineConfig
from slotserver.access.api_keys import keys_from_args
from slotserver.access.cors import CorsPolicy
from slotserver.server.chat_options import chat_defaults_from_flags, flag_json_object
from slotserver.server.launch import LaunchPlan
from slotserver.server.config import GenerationDefaults, ServerConfig
from slotserver.server.embed_config import embedding_config_from_args


def _text_or_file(value: str | None, file: Path | None, flag: str) -> str | None:
    """`--FLAG TEXT` or `--FLAG-file PATH` (not both) -> the text, or None."""
    if value is not None and file is not None:
        raise ConfigError(f"give {flag} or {flag}-file, not both")
    if file is None:
        return value
    try:
        return Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{flag}-file {file}: {getattr(e, 'strerror', None) or e}") from None


def chat_template_source(value: str | None, file: Path | None) -> str | None:
    """--chat-template (one of llama.cpp's built-in names or a Jinja source) or --chat-template-file,
    compiled to check it."""
    value, named = _text_or_file(value, file, "--chat-template"), file is None and value is not None
    if named and named_template(value) is not None:
        value = named_template(value)
    elif named and "{{" not in value and "{%" not in value:
        raise ConfigError(f"--chat-template {value!r} is neither a known name "
                          f"({', '.join(BUILTIN_NAMES)}) nor a Jinja template")
    if value is not None:
        ChatTemplate(value)  # raises ChatTemplateError (one line) on a syntax error
    return value


def _slot_save_path(path: Path | None) -> Path | None:
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--slot-save-path {path}: {e.strerror or e}") from None
    return path


def _model_path(args) -> Path:
    from slotserver.model.default_model import default_model_path
    from slotserver.model.gguf_file import directory_problem

    path = Path(args.model or default_model_path())
    if path.is_dir():
        raise ConfigError(f"model {path} {directory_problem(path)}")
    if not path.is_file():
        raise ConfigError(f"model file {path} not found")
    return path


def _resolve_ctx_size(args) -> None:
    """`-c 0` (llama-server's default): the model's training context (stretched by a command-line
    YaRN factor: model/spec.py `_ctx_train`), sized as llama-server sizes it:
    - no -np given: llama-server's automatic slots share one unified pool, so with neither -kvu nor
      -no-kvu given -kvu is turned on here too: one training context in all, any slot may use all of it;
    - -np N without -kvu: N training contexts, one per slot (llama-server's fit for an explicit -np);
    - -kvu (or -no-kvu without -np): one training context in all;
    - an embedding server (no KV cache): every slot takes the whole training context."""
    if args.ctx_size != 0:
        return
    from slotserver.model.gguf_file import GGUFFile
    from slotserver.model.spec import ModelSpec

    f = GGUFFile.open(_model_path(args))
    metadata_overrides.apply_overrides(f.path, f.metadata, metadata_overrides.from_args(args))
    arch = f.metadata.get("general.architecture")
    if arch in ("bert", "nomic-bert", "modern-bert"):   # encoders: their position limit
        args.ctx_size = f.metadata.get(f"{arch}.context_length") or 512
    else:
        args.ctx_size = ModelSpec.from_gguf(f, RopeFlags.from_args(args)).ctx_train
    given = {a.split("=")[0] for a in (*getattr(args, "serve_argv", ()), *getattr(args, "env_argv", ()))}
    parallel = bool(given & {"-np", "--parallel"})
    if getattr(args, "embedding", False) or getattr(args, "reranking", False):
        args.ctx_size *= max(1, args.parallel)   # an encoder's slots hold no KV: each takes the whole context
    elif not parallel and not given & {"-kvu", "--kv-unified", "-no-kvu", "--no-kv-unified"} \
            and args.layout in ("seq_head_dim", "head_seq_dim", "paged", "paged_hnd"):
        args.kv_unified = True   # llama-server's automatic slots: one pool any slot may fill
    elif not getattr(args, "kv_unified", False) and parallel:
        args.ctx_size *= max(1, args.parallel)   # -c is shared by the slots: each gets the training context
    logging.getLogger("slotserver.load").info("-c 0: the model's training context, %d cells in all%s", args.ctx_size,
                                              " (a unified pool)" if getattr(args, "kv_unified", False) else "")


def _device(args) -> str:
    """--device, where llama-server's `-ngl 0` (no layer offloaded; cli/compat_args.py) means the CPU
    while --device is auto."""
    ngl = getattr(args, "n_gpu_layers", None)
    return "cpu" if args.device == "auto" and ngl is not None and ngl.strip() == "0" else args.device


def server_config_from_args(args) -> ServerConfig:
    _resolve_ctx_size(args)
    defaults = GenerationDefaults(n_predict=args.n_predict, temperature=args.temp, seed=args.seed,
                                  cache_prompt=args.cache_prompt,
                                  reasoning_budget=getattr(args, "reasoning_budget", -1),
                                  reasoning_budget_message=getattr(args, "reasoning_budget_message", ""),
                                  sse_ping_interval=getattr(args, "sse_ping_interval", 30),
                                  special=getattr(args, "special", False),
                                  fields=getattr(args, "request_fields", None) or {})   # cli/sampling_args.py
    return ServerConfig(
        model_path=str(_model_path(args)), alias=",".join(args.alias), tags=",".join(getattr(args, "tags", [])), api_keys=keys_from_args(args),
        cors=CorsPolicy.from_args(args),
        api_prefix=getattr(args, "api_prefix", ""), slots_endpoint=args.slots, slots_debug=args.slots_debug,
        metrics=args.metrics, lab_api=not args.no_lab_api, slot_save_path=_slot_save_path(args.slot_save_path),
        timeout=args.timeout,
        defaults=defaults,
        chat=chat_defaults_from_flags(getattr(args, "reasoning_format", "auto"),
                                      getattr(args, "chat_template_kwargs", None),
                                      getattr(args, "reasoning", "auto"), getattr(args, "tool_call_format", "auto"),
                                      getattr(args, "reasoning_effort", "default"),
                                      getattr(args, "reasoning_preserve", True), getattr(args, "prefill_assistant", True),
                                      getattr(args, "skip_chat_parsing", False)),
        embedding=_embedding(args),   # None unless --embedding / --reranking
        spm_infill=getattr(args, "spm_infill", False),
        webui=getattr(args, "webui", True),
        static_path=getattr(args, "static_path", None),
        ui_settings=_ui_settings(getattr(args, "ui_config", None), getattr(args, "ui_config_file", None)),
        props_endpoint=getattr(args, "props_endpoint", False),
    )


def _ui_settings(text: str | None, file: Path | None) -> dict:
    """--ui-config JSON or --ui-config-file PATH (not both) -> the object /props shows as ui_settings."""
    return flag_json_object(_text_or_file(text, file, "--ui-config"), "--ui-config")


def _unified(args) -> tuple[int, int | None, str]:
    """(ctx_size for EngineConfig, pool cells, layout). `--kv-unified` (llama-server's -kvu): every
    slot may use the whole context and all slots share one pool of `--ctx-size` cells, i.e. the
    paged layout with slots of ctx cells and a pool of ctx cells (requests wait, or the least
    advanced is preempted and recomputed, when the pool is full)."""
    if not getattr(args, "kv_unified", False):
        return args.ctx_size, args.kv_pool_cells, args.layout
    if args.layout not in ("paged", "paged_hnd", "seq_head_dim", "head_seq_dim"):
        raise ConfigError(f"--kv-unified needs a paged layout, got --layout {args.layout}")
    layout = args.layout if args.layout.startswith("paged") else "paged"
    return args.ctx_size * args.parallel, args.kv_pool_cells or args.ctx_size, layout


def _cache_type(args) -> str:
    """-ctk/-ctv -> EngineConfig.cache_type: one type for K and V (a float cache holds both alike)."""
    k, v = args.cache_type_k, args.cache_type_v
    if k != v and "auto" not in (k, v):
        raise ConfigError(f"--cache-type-k {k} and --cache-type-v {v} differ: K and V share one element type here")
    return v if k == "auto" else k


def plan_from_args(args) -> LaunchPlan:
    _resolve_ctx_size(args)
    ctx_size, pool, layout = _unified(args)
    engine = EngineConfig(
        n_parallel=args.parallel, ctx_size=ctx_size, batch_size=args.batch_size,
        ubatch_size=args.ubatch_size, defrag=args.defrag, slot_prompt_similarity=args.slot_prompt_similarity,
        cache_prompt=args.cache_prompt, n_predict=args.n_predict, slot_save_path=args.slot_save_path,
        queue_limit=args.max_queue, kv_pool_cells=pool, cache_type=_cache_type(args),
        sleep_idle_s=args.sleep_idle_seconds, cache_ram_mib=args.cache_ram, cache_idle_slots=args.cache_idle_slots,
        cache_disk=args.cache_disk, cache_disk_mib=args.cache_disk_mib,
        kv_unified=bool(getattr(args, "kv_unified", False)), spec=spec_config_from_args(args),
        context_shift=args.context_shift, cache_reuse=getattr(args, "cache_reuse", 0),
        ctx_checkpoints=getattr(args, "ctx_checkpoints", EngineConfig.ctx_checkpoints),
        async_steps=getattr(args, "async_steps", "auto"),
        adaptive_threads=getattr(args, "adaptive_threads", "auto"),
    )
    model = ModelConfig(model_path=_model_path(args), dtype=args.dtype, weights=args.weights, threads=args.threads,
                        layout=layout, kernels_dir=args.kernels_dir, layouts_dir=args.layouts_dir,
                        max_ctx=engine.n_cells, step_graphs=not args.no_step_graphs, device=_device(args),
                        gpu_weights=getattr(args, "gpu_weights", "auto"),
                        fused_gemv=getattr(args, "fused_gemv", "off") == "on",
                        lora=lora_flags(getattr(args, "lora_items", None)),
                        lora_init_without_apply=getattr(args, "lora_init_without_apply", False),
                        rope_flags=RopeFlags.from_args(args), kv_overrides=metadata_overrides.from_args(args),
                        control_vectors=lora_flags(getattr(args, "control_items", None), "--control-vector-scaled"),
                        control_layers=tuple(args.control_layers) if getattr(args, "control_layers", None) else None)
    template = chat_template_source(args.chat_template, args.chat_template_file)
    return LaunchPlan(model=model, engine=engine, host=args.host, port=args.port, chat_template=template,
                      ssl_key=getattr(args, "ssl_key_file", None), ssl_cert=getattr(args, "ssl_cert_file", None),
                      reuse_port=getattr(args, "reuse_port", False),
                      watch=not args.no_watch, warmup=not args.no_warmup, check_tensors=getattr(args, "check_tensors", False))


def _embedding(args):
    """--embedding / --reranking's config; with --lora a ConfigError: the encoders apply no adapter."""
    config = embedding_config_from_args(args)
    if config is not None and getattr(args, "lora_items", None):
        raise ConfigError("--lora does not run with --embedding / --reranking: embeddings are computed without "
                          "adapters here")
    return config


def spec_config_from_args(args) -> SpecConfig:
    """The --spec-* flags (cli/spec_args.py) -> a validated SpecConfig (a bad value: a ConfigError naming it)."""
    names = ("draft_n_max", "draft_n_min", "draft_p_min", "ngram_simple_size_n", "ngram_simple_size_m",
             "ngram_mod_n_match", "ngram_mod_n_min", "ngram_mod_n_max")
    draft, default = getattr(args, "spec_draft_model", None), SpecConfig()
    rates = getattr(args, "spec_synth_rates", None)
    try:
        rates = tuple(float(r) for r in rates.split(",")) if rates else ()
    except ValueError:
        raise ConfigError(f"--spec-synth-rates must be comma-separated numbers, got {rates!r}") from None
    return SpecConfig(types=SpecConfig.parse_types(getattr(args, "spec_type", None), draft), draft_model=draft,
                      adaptive=getattr(args, "spec_adaptive", True), synth_rates=rates,
                      synth_len=getattr(args, "spec_synth_len", None),
                      **{n: getattr(args, "spec_" + n, getattr(default, n)) for n in names})
