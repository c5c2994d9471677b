"""llama-server's environment variables (`LLAMA_ARG_CTX_SIZE=8192`, `LLAMA_API_KEY`...), as Docker and
systemd setups of llama-server configure it: each stands for its flag, and a flag on the command
line wins over its variable, as in llama-server (common/arg.cpp, common_params_parse_ex). A switch's
variable takes on/enabled/true/1 or off/disabled/false/0 (llama-server ignores other values; here
they are an error naming the variable); `LLAMA_ARG_NO_X` (for a flag with a `--no-` form) means off.
A value is checked against its flag here, so an error names the variable. A variable of a
llama-server flag that `slotserver serve` does not take stops the server with one line naming both,
as the flag itself would. The variables used are named in one start-up line (keys masked):
`LLAMA_ARG_HOST=0.0.0.0`, which llama.cpp's Docker images set, moves the server off loopback. TABLE
is generated from llama.cpp's common/arg.cpp by playground/llama_env_table.py (the llama-cpp-python
0.3.36 sources).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

TRUE, FALSE = ("on", "enabled", "true", "1"), ("off", "disabled", "false", "0")

# (variable, flag spellings, negative spellings): every llama-server option with a variable
TABLE: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ('LLAMA_ARG_THREADS', ('-t', '--threads'), ()),
    ('LLAMA_ARG_CTX_SIZE', ('-c', '--ctx-size'), ()),
    ('LLAMA_ARG_KV_UNIFIED_PER_SLOT', ('--kv-unified-per-slot',), ()),
    ('LLAMA_ARG_N_PREDICT', ('-n', '--predict', '--n-predict'), ()),
    ('LLAMA_ARG_BATCH', ('-b', '--batch-size'), ()),
    ('LLAMA_ARG_UBATCH', ('-ub', '--ubatch-size'), ()),
    ('LLAMA_ARG_SWA_FULL', ('--swa-full',), ()),
    ('LLAMA_ARG_CTX_CHECKPOINTS', ('-ctxcp', '--ctx-checkpoints', '--swa-checkpoints'), ()),
    ('LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT', ('-cms', '--checkpoint-min-step'), ()),
    ('LLAMA_ARG_CACHE_RAM', ('-cram', '--cache-ram'), ()),
    ('LLAMA_ARG_KV_UNIFIED', ('-kvu', '--kv-unified'), ('-no-kvu', '--no-kv-unified')),
    ('LLAMA_ARG_CACHE_IDLE_SLOTS', ('--cache-idle-slots',), ('--no-cache-idle-slots',)),
    ('LLAMA_ARG_CONTEXT_SHIFT', ('--context-shift',), ('--no-context-shift',)),
    ('LLAMA_ARG_FLASH_ATTN', ('-fa', '--flash-attn'), ()),
    ('LLAMA_ARG_PERF', ('--perf',), ('--no-perf',)),
    ('LLAMA_ARG_TEMPERATURE', ('--temp', '--temperature'), ()),
    ('LLAMA_ARG_TOP_K', ('--top-k',), ()),
    ('LLAMA_ARG_TOP_P', ('--top-p',), ()),
    ('LLAMA_ARG_MIN_P', ('--min-p',), ()),
    ('LLAMA_ARG_REPEAT_PENALTY', ('--repeat-penalty',), ()),
    ('LLAMA_ARG_PRESENCE_PENALTY', ('--presence-penalty',), ()),
    ('LLAMA_ARG_FREQUENCY_PENALTY', ('--frequency-penalty',), ()),
    ('LLAMA_ARG_BACKEND_SAMPLING', ('-bs', '--backend-sampling'), ()),
    ('LLAMA_ARG_POOLING', ('--pooling',), ()),
    ('LLAMA_ARG_ROPE_SCALING_TYPE', ('--rope-scaling',), ()),
    ('LLAMA_ARG_ROPE_SCALE', ('--rope-scale',), ()),
    ('LLAMA_ARG_ROPE_FREQ_BASE', ('--rope-freq-base',), ()),
    ('LLAMA_ARG_ROPE_FREQ_SCALE', ('--rope-freq-scale',), ()),
    ('LLAMA_ARG_YARN_ORIG_CTX', ('--yarn-orig-ctx',), ()),
    ('LLAMA_ARG_YARN_EXT_FACTOR', ('--yarn-ext-factor',), ()),
    ('LLAMA_ARG_YARN_ATTN_FACTOR', ('--yarn-attn-factor',), ()),
    ('LLAMA_ARG_YARN_BETA_SLOW', ('--yarn-beta-slow',), ()),
    ('LLAMA_ARG_YARN_BETA_FAST', ('--yarn-beta-fast',), ()),
    ('LLAMA_ARG_KV_OFFLOAD', ('-kvo', '--kv-offload'), ('-nkvo', '--no-kv-offload')),
    ('LLAMA_ARG_REPACK', ('--repack',), ('-nr', '--no-repack')),
    ('LLAMA_ARG_NO_HOST', ('--no-host',), ()),
    ('LLAMA_ARG_CACHE_TYPE_K', ('-ctk', '--cache-type-k'), ()),
    ('LLAMA_ARG_CACHE_TYPE_V', ('-ctv', '--cache-type-v'), ()),
    ('LLAMA_ARG_DEFRAG_THOLD', ('-dt', '--defrag-thold'), ()),
    ('LLAMA_ARG_N_PARALLEL', ('-np', '--parallel'), ()),
    ('LLAMA_ARG_CONT_BATCHING', ('-cb', '--cont-batching'), ('-nocb', '--no-cont-batching')),
    ('LLAMA_ARG_MMPROJ', ('-mm', '--mmproj'), ()),
    ('LLAMA_ARG_MMPROJ_URL', ('-mmu', '--mmproj-url'), ()),
    ('LLAMA_ARG_MMPROJ_AUTO', ('--mmproj-auto',), ('--no-mmproj', '--no-mmproj-auto')),
    ('LLAMA_ARG_MMPROJ_OFFLOAD', ('--mmproj-offload',), ('--no-mmproj-offload',)),
    ('LLAMA_ARG_IMAGE_MIN_TOKENS', ('--image-min-tokens',), ()),
    ('LLAMA_ARG_IMAGE_MAX_TOKENS', ('--image-max-tokens',), ()),
    ('LLAMA_ARG_MTMD_BATCH_MAX_TOKENS', ('--mtmd-batch-max-tokens',), ()),
    ('LLAMA_ARG_VIDEO_FPS', ('--video-fps',), ()),
    ('LLAMA_ARG_VIDEO_TIMESTAMP_INTERVAL', ('--video-timestamp-interval',), ()),
    ('LLAMA_ARG_VIDEO_FFMPEG_DIR', ('--video-ffmpeg-dir',), ()),
    ('LLAMA_ARG_RPC', ('--rpc',), ()),
    ('LLAMA_ARG_LOAD_MODE', ('-lm', '--load-mode'), ()),
    ('LLAMA_ARG_LAZY_MODE', ('-lzm', '--lazy-mode'), ()),
    ('LLAMA_ARG_NUMA', ('--numa',), ()),
    ('LLAMA_ARG_DEVICE', ('-dev', '--device'), ()),
    ('LLAMA_ARG_OVERRIDE_TENSOR', ('-ot', '--override-tensor'), ()),
    ('LLAMA_ARG_CPU_MOE', ('-cmoe', '--cpu-moe'), ()),
    ('LLAMA_ARG_N_CPU_MOE', ('-ncmoe', '--n-cpu-moe'), ()),
    ('LLAMA_ARG_N_CPU_FFN', ('-ncffn', '--n-cpu-ffn'), ()),
    ('LLAMA_ARG_N_GPU_LAYERS', ('-ngl', '--gpu-layers', '--n-gpu-layers'), ()),
    ('LLAMA_ARG_SPLIT_MODE', ('-sm', '--split-mode'), ()),
    ('LLAMA_ARG_TENSOR_SPLIT', ('-ts', '--tensor-split'), ()),
    ('LLAMA_ARG_MAIN_GPU', ('-mg', '--main-gpu'), ()),
    ('LLAMA_ARG_FIT', ('-fit', '--fit'), ()),
    ('LLAMA_ARG_FIT_TARGET', ('-fitt', '--fit-target'), ()),
    ('LLAMA_ARG_FIT_CTX', ('-fitc', '--fit-ctx'), ()),
    ('LLAMA_ARG_ALIAS', ('-a', '--alias'), ()),
    ('LLAMA_ARG_TAGS', ('--tags',), ()),
    ('LLAMA_ARG_MODEL', ('-m', '--model'), ()),
    ('LLAMA_ARG_MODEL_URL', ('-mu', '--model-url'), ()),
    ('LLAMA_ARG_DOCKER_REPO', ('-dr', '--docker-repo'), ()),
    ('LLAMA_ARG_HF_REPO', ('-hf', '-hfr', '--hf-repo'), ()),
    ('LLAMA_ARG_HF_FILE', ('-hff', '--hf-file'), ()),
    ('LLAMA_ARG_HOST', ('--host',), ()),
    ('LLAMA_ARG_PORT', ('--port',), ()),
    ('LLAMA_ARG_REUSE_PORT', ('--reuse-port',), ()),
    ('LLAMA_ARG_STATIC_PATH', ('--path',), ()),
    ('LLAMA_ARG_CORS_ORIGINS', ('--cors-origins',), ()),
    ('LLAMA_ARG_CORS_METHODS', ('--cors-methods',), ()),
    ('LLAMA_ARG_CORS_HEADERS', ('--cors-headers',), ()),
    ('LLAMA_ARG_CORS_CREDENTIALS', ('--cors-credentials',), ('--no-cors-credentials',)),
    ('LLAMA_ARG_API_PREFIX', ('--api-prefix',), ()),
    ('LLAMA_ARG_UI_CONFIG', ('--ui-config', '--webui-config'), ()),
    ('LLAMA_ARG_UI_CONFIG_FILE', ('--ui-config-file', '--webui-config-file'), ()),
    ('LLAMA_ARG_UI_MCP_PROXY',
     ('--ui-mcp-proxy', '--webui-mcp-proxy'), ('--no-ui-mcp-proxy', '--no-webui-mcp-proxy')),
    ('LLAMA_ARG_TOOLS', ('--tools',), ()),
    ('LLAMA_ARG_TOOLS_RUNTIME', ('--tools-runtime',), ()),
    ('LLAMA_ARG_MCP_SERVERS_CONFIG', ('--mcp-servers-config',), ()),
    ('LLAMA_ARG_MCP_SERVERS_JSON', ('--mcp-servers-json',), ()),
    ('LLAMA_ARG_AGENT', ('-ag', '--agent'), ('-no-ag', '--no-agent')),
    ('LLAMA_ARG_UI', ('--ui', '--webui'), ('--no-ui', '--no-webui')),
    ('LLAMA_ARG_EMBEDDINGS', ('--embedding', '--embeddings'), ()),
    ('LLAMA_ARG_RERANKING', ('--rerank', '--reranking'), ()),
    ('LLAMA_API_KEY', ('--api-key',), ()),
    ('LLAMA_ARG_API_KEY_FILE', ('--api-key-file',), ()),
    ('LLAMA_ARG_SSL_KEY_FILE', ('--ssl-key-file',), ()),
    ('LLAMA_ARG_SSL_CERT_FILE', ('--ssl-cert-file',), ()),
    ('LLAMA_ARG_CHAT_TEMPLATE_KWARGS', ('--chat-template-kwargs',), ()),
    ('LLAMA_ARG_TIMEOUT', ('-to', '--timeout'), ()),
    ('LLAMA_ARG_SSE_PING_INTERVAL', ('--sse-ping-interval',), ()),
    ('LLAMA_ARG_THREADS_HTTP', ('--threads-http',), ()),
    ('LLAMA_ARG_CACHE_PROMPT', ('--cache-prompt',), ('--no-cache-prompt',)),
    ('LLAMA_ARG_CACHE_REUSE', ('--cache-reuse',), ()),
    ('LLAMA_ARG_ENDPOINT_METRICS', ('--metrics',), ()),
    ('LLAMA_ARG_ENDPOINT_PROPS', ('--props',), ()),
    ('LLAMA_ARG_ENDPOINT_SLOTS', ('--slots',), ('--no-slots',)),
    ('LLAMA_ARG_MODELS_DIR', ('--models-dir',), ()),
    ('LLAMA_ARG_MODELS_PRESET', ('--models-preset',), ()),
    ('LLAMA_ARG_MODELS_MAX', ('--models-max',), ()),
    ('LLAMA_ARG_MODELS_AUTOLOAD', ('--models-autoload',), ('--no-models-autoload',)),
    ('LLAMA_ARG_JINJA', ('--jinja',), ('--no-jinja',)),
    ('LLAMA_ARG_THINK', ('--reasoning-format',), ()),
    ('LLAMA_ARG_REASONING', ('-rea', '--reasoning'), ()),
    ('LLAMA_ARG_REASONING_EFFORT', ('--reasoning-effort',), ()),
    ('LLAMA_ARG_THINK_BUDGET', ('--reasoning-budget',), ()),
    ('LLAMA_ARG_THINK_BUDGET_MESSAGE', ('--reasoning-budget-message',), ()),
    ('LLAMA_ARG_REASONING_PRESERVE', ('--reasoning-preserve',), ('--no-reasoning-preserve',)),
    ('LLAMA_ARG_CHAT_TEMPLATE', ('--chat-template',), ()),
    ('LLAMA_ARG_CHAT_TEMPLATE_FILE', ('--chat-template-file',), ()),
    ('LLAMA_ARG_SKIP_CHAT_PARSING', ('--skip-chat-parsing',), ('--no-skip-chat-parsing',)),
    ('LLAMA_ARG_PREFILL_ASSISTANT', ('--prefill-assistant',), ('--no-prefill-assistant',)),
    ('LLAMA_ARG_LOG_FILE', ('--log-file',), ()),
    ('LLAMA_ARG_LOG_JSONL', ('--log-jsonl',), ('--no-log-jsonl',)),
    ('LLAMA_ARG_LOG_COLORS', ('--log-colors',), ()),
    ('LLAMA_ARG_OFFLINE', ('--offline',), ()),
    ('LLAMA_ARG_LOG_VERBOSITY', ('-lv', '--verbosity', '--log-verbosity'), ()),
    ('LLAMA_ARG_LOG_PREFIX', ('--log-prefix',), ('--no-log-prefix',)),
    ('LLAMA_ARG_LOG_TIMESTAMPS', ('--log-timestamps',), ('--no-log-timestamps',)),
    ('LLAMA_ARG_SPEC_DRAFT_HF_REPO', ('--spec-draft-hf', '-hfd', '-hfrd', '--hf-repo-draft'), ()),
    ('LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K', ('--spec-draft-type-k', '-ctkd', '--cache-type-k-draft'), ()),
    ('LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V', ('--spec-draft-type-v', '-ctvd', '--cache-type-v-draft'), ()),
    ('LLAMA_ARG_SPEC_DRAFT_CPU_MOE', ('--spec-draft-cpu-moe', '-cmoed', '--cpu-moe-draft'), ()),
    ('LLAMA_ARG_SPEC_DRAFT_N_CPU_MOE',
     ('--spec-draft-n-cpu-moe', '--spec-draft-ncmoe', '-ncmoed', '--n-cpu-moe-draft'), ()),
    ('LLAMA_ARG_SPEC_DRAFT_N_MAX', ('--spec-draft-n-max',), ()),
    ('LLAMA_ARG_SPEC_DRAFT_N_MIN', ('--spec-draft-n-min',), ()),
    ('LLAMA_ARG_SPEC_SYNTH_LEN', ('--spec-synth-len',), ()),
    ('LLAMA_ARG_SPEC_SYNTH_RATES', ('--spec-synth-rates',), ()),
    ('LLAMA_ARG_SPEC_DRAFT_P_SPLIT', ('--spec-draft-p-split', '--draft-p-split'), ()),
    ('LLAMA_ARG_SPEC_DRAFT_P_MIN', ('--spec-draft-p-min', '--draft-p-min'), ()),
    ('LLAMA_ARG_SPEC_DRAFT_BACKEND_SAMPLING',
     ('--spec-draft-backend-sampling',), ('--no-spec-draft-backend-sampling',)),
    ('LLAMA_ARG_N_GPU_LAYERS_DRAFT',
     ('--spec-draft-ngl', '-ngld', '--gpu-layers-draft', '--n-gpu-layers-draft'), ()),
    ('LLAMA_ARG_SPEC_DRAFT_MODEL', ('--spec-draft-model', '-md', '--model-draft'), ()),
    ('LLAMA_ARG_SPEC_TYPE', ('--spec-type',), ()),
    ('LLAMA_ARG_DRAFT_MAX', ('--draft', '--draft-n', '--draft-max'), ()),
    ('LLAMA_ARG_DRAFT_MIN', ('--draft-min', '--draft-n-min'), ()),
)


SECRET = ("KEY", "TOKEN")   # variables whose values the start-up line does not show
# llama-server's -dev names devices ("none": the CPU): --device's type (cli/generate.py)
def device_name(value: str) -> str:
    """llama-server's -dev names: none -> cpu, CUDA0 -> cuda (the first visible GPU); another GPU is
    chosen with CUDA_VISIBLE_DEVICES, not here."""
    low = value.lower()
    if low == "none":
        return "cpu"
    if low.startswith("cuda") and low not in ("cuda", "cuda0"):   # `cuda`: --device's own value
        raise argparse.ArgumentTypeError("slotserver uses the first visible GPU: choose it with "
                                         "CUDA_VISIBLE_DEVICES=N and LLAMA_ARG_DEVICE=CUDA0 (or unset)")
    return "cuda" if low == "cuda0" else value


def _given(argv: list[str]) -> set[str]:
    return {a.partition("=")[0] for a in argv if a.startswith("-")}


def _switch(env: str, value: str, on: list[str], off: list[str]) -> list[str]:
    if value.lower() in TRUE:
        return on[:1]
    if value.lower() in FALSE:
        return off[:1]
    raise argparse.ArgumentTypeError(f"{env}={value!r}: expected one of {', '.join(TRUE + FALSE)}")


def _valued(env: str, value: str, action: argparse.Action) -> list[str]:
    """`--flag=value` (a value starting with `-` stays a value), checked here so an error names the variable."""
    if not value.strip() and (action.type is not None or "--host" in action.option_strings):
        raise argparse.ArgumentTypeError(f"{env} is set but empty (an unset variable in a compose file?)")
    try:
        converted = action.type(value) if callable(action.type) else value
    except (argparse.ArgumentTypeError, TypeError, ValueError) as e:
        raise argparse.ArgumentTypeError(f"{env}={value!r}: {e or 'not a valid value'}") from None
    if action.choices is not None and converted not in action.choices:
        raise argparse.ArgumentTypeError(f"{env}={value!r}: expected one of {', '.join(map(str, action.choices))}")
    spelling = next((o for o in action.option_strings if o.startswith("--")), action.option_strings[0])
    return [f"{spelling}={value}"] if spelling.startswith("--") else [spelling, value]


def env_argv(known: Mapping[str, argparse.Action], argv: list[str],
             environ: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(the flags llama-server's variables in `environ` stand for, minus those `argv` gives itself
    in any spelling; the variables used). `known`: the parser's option strings. Raises
    ArgumentTypeError naming the variable."""
    given, out, used = _given(argv), [], []
    for env, names, negative in TABLE:
        no_env = env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_") if negative else None
        value = "0" if no_env and no_env in environ else environ.get(env)
        on, off = [n for n in names if n in known], [n for n in negative if n in known]
        spellings = {*names, *negative, *(s for n in on + off for s in known[n].option_strings)}
        if value is None or given & spellings:
            continue
        if not on:
            raise argparse.ArgumentTypeError(f"{env} (llama-server's {names[-1]}) is not supported by slotserver")
        action = known[on[0]]
        flags = _switch(env, value, on, off) if action.nargs == 0 else _valued(env, value, action)
        # the flags the variable resolves to (`--mmproj=PATH` is --mmproj's), not the ones it does not set
        refused = [known[f.split("=")[0]] for f in flags if getattr(known.get(f.split("=")[0]), "refusal", None)]
        if refused:
            name = next(o for o in refused[0].option_strings if o.startswith("--"))
            raise argparse.ArgumentTypeError(f"{env}={value!r} (llama-server's {name}): {refused[0].refusal}")
        out += flags
        used.append(no_env if no_env and no_env in environ else env)
    return out, used


def shown(environ: Mapping[str, str], used: list[str]) -> str:
    """`LLAMA_ARG_CTX_SIZE=8192, LLAMA_API_KEY=(set)`: the start-up line's account of the variables."""
    return ", ".join(f"{v}=(set)" if any(w in v for w in SECRET) else f"{v}={environ.get(v, '')}" for v in used)


def env_flags(flags: Mapping[str, tuple[str, bool]]) -> dict[str, tuple[str, bool]]:
    """{variable: the flag entry it stands for} for a flag table (cli/router_args.py flag_table):
    a preset file's `LLAMA_ARG_N_PARALLEL = 2` names `--parallel` (router/preset_ini.py)."""
    out = {}
    for env, names, negative in TABLE:
        on, off = [n for n in names if n in flags], [n for n in negative if n in flags]
        if on:
            out[env] = flags[on[0]]
        if off:   # LLAMA_ARG_NO_UI = true names --no-webui
            out[env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_")] = flags[off[0]]
    return out
