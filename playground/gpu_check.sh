#!/usr/bin/env bash
# One-shot GPU check (issue 34): everything a lent GPU machine (no network, minutes) has to do,
# part by part, each with its own time slice, in the order of what matters most:
#   versions  nvidia-smi, python/torch/triton/CUDA, which packages the image lacks;
#   wheels    installs .gpu_wheels/ (carry it; playground/gpu_wheels.sh makes it);
#   build     `slotserver lab build`: the CPU's C kernels compiled on all cores before the tests use them;
#   tests     the CUDA tests of tests/test_device.py (GPU vs CPU tokens, CUDA-graph replays, the engine);
#   model     playground/gpu_model_check.sh: random-weight Qwen2.5-0.5B shapes (Q4_K, BF16, Q8_0),
#             generate, decode ms/step with CUDA graphs and eager vs the bytes bound, HTTP bench;
#   hf        playground/hf_bench.py: Hugging Face transformers, static cache, same shape, bf16;
#   kernels   playground/gpu_kernel_bench.py: rms_norm/rope/silu/gelu vs copy bandwidth, prefill vs SDPA
#             (strided and paged), the prefill tile sweep (PREFILL_TILES overrides it);
#   archs     tests/test_device_archs.py: every architecture fixture's greedy tokens on the card;
#   sweep     playground/layout_sweep.py --device cuda: every layout, serving kernels, CUDA-graph times;
#   lab       `slotserver lab check` on cuda (every kernel: Triton numerics vs reference, AOT);
#   attention playground/gpu_attention_bench.py: decode attention vs SDPA and the copy bandwidth;
#   big       Llama-3.1-8B's shape in Q4_K (random weights): load time, decode ms/step vs the bytes bound;
#   launches  playground/decode_launches.py: the CUDA kernels of one replayed decode step, per layer;
#   qmatmul   playground/gpu_qmatmul_bench.py: GGUF-block Triton matmuls vs cuBLAS on dense bf16;
#   sampling  playground/gpu_sampling_bench.py: the sampler chain on the device vs a copy to the host;
#   http      playground/http_overhead.py: the server's CPU per streamed token, asyncio vs uvloop.
#   gemvab    the fused-GEMV decode body (--fused-gemv) against the lean body, Qwen2.5-0.5B BF16;
#   qgemvab   Llama-8B's shape: dense bf16 and GGUF blocks with the defaults (the wide GEMV at 1-2 rows,
#             the int8 product from 3), blocks on the lean body without the norms' q8_1 and on the old
#             body (--body noq8,old), blocks with the wide GEMV alone (SLOTSERVER_QMMA=off) and the
#             slices alone (SLOTSERVER_QGEMV=slices SLOTSERVER_QMMA=off); then the Q4_K_M mix (Q6_K
#             output, attn_v, ffn_down in half the layers) dense and on blocks;
#   qrows     the int8 product against the wide GEMV per matmul at 2-8 rows, the 8B blocks at b=1-8;
#   gemv      playground/gpu_gemv_bench.py: each fused GEMV against what the lean body launches.
# The default parts (for the seventh round): the tests, the kernels with the prefill tile sweep, the
# GGUF-block decode, the model, launches and labtime (the sixth round's budget cut those two), the
# GGUF matmul table (QMATMUL_TUNE=1 adds its tuning, done on an H200 in the sixth round) and HTTP;
# archs (40/40 on an H200 in the sixth round; 53 tests now, 100 s), lab, attention, big, gemv, gemvab, hf, sweep, sampling,
# tests2 and qrows run when named in GPU_CHECK_PARTS. A part starts only with at
# least 20 s left; a part whose script is absent is skipped; logs go to OUT_DIR/<part>.log, a short
# table last. GPU_CHECK_TAR=FILE also packs OUT_DIR into FILE after every part: the device tool
# brings back a handful of files per call (the fourth round lost 11 of 19 logs), one archive always
# comes back, and a run stopped by its timeout keeps what its finished parts wrote.
#
#   cd <repo root> && PYTHONPATH=. bash playground/gpu_check.sh [OUT_DIR]
#   GPU_CHECK_PARTS=tests,model GPU_CHECK_TOTAL_S=200 ...   (a subset, a shorter budget)
#   GPU_CHECK_DRY=1 ...   (the same parts on a CPU: tiny shapes, --device cpu, TRITON_INTERPRET)
#   on a lent GPU: GPU_CHECK_TAR=$OUT/gpu_check.tgz PYTHONPATH=. bash playground/gpu_check.sh /tmp/gpu_check
set -u
T0=$(date +%s)
TOTAL_S=${GPU_CHECK_TOTAL_S:-500}
PARTS=${GPU_CHECK_PARTS:-versions,wheels,build,tests,kernels,qgemvab,model,launches,labtime,qmatmul,http}
OUT_DIR="${1:-${OUT:-./gpu_out}}"
mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd)
cd "$(dirname "$0")/.." || exit 1        # the repo root
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PY=${PYTHON:-python}
DRY=${GPU_CHECK_DRY:-0}
elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( TOTAL_S - $(date +%s) + T0 )); }
declare -A RC

# part NAME SLICE_S CMD...: CMD under a timeout of min(SLICE_S, time left - 5), output in NAME.log
part() {
    local name=$1 slice=$2; shift 2
    [[ ",$PARTS," == *",$name,"* ]] || return 0
    local t=$(( $(left) - 5 )); (( t > slice )) && t=$slice
    if (( t < 20 )); then echo "== $name: skipped ($(left) s left)"; RC[$name]=skipped; return 0; fi
    echo "== $name (up to $t s, at $(elapsed) s)"
    if declare -F "$1" >/dev/null; then   # a function of this script: timeout runs programs only
        PART_S=$t timeout "$t" bash -c "$(declare -f); $*" > "$OUT_DIR/$name.log" 2>&1
    else
        PART_S=$t timeout "$t" "$@" > "$OUT_DIR/$name.log" 2>&1
    fi
    RC[$name]=$?
    grep -v -e "UserWarning" -e "warn_once" -e "warnings.warn" "$OUT_DIR/$name.log" | tail -${TAIL:-25}
    (( RC[$name] == 124 )) && echo "$name: stopped by its $t s timeout"
    [[ -n "${GPU_CHECK_TAR:-}" ]] && tar czf "$GPU_CHECK_TAR" -C "$OUT_DIR" .
    echo "$name: exit ${RC[$name]} after $(elapsed) s"
}

echo "== gpu_check: $(date -u +%FT%TZ), repo $(git rev-parse --short HEAD 2>/dev/null || echo '?') (dirty files: $(git status --porcelain 2>/dev/null | wc -l)), out $OUT_DIR"
versions() {
    nvidia-smi && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.memory,power.limit --format=csv
    $PY - <<'EOF'
import importlib.util, platform
import torch, triton
print(f"python {platform.python_version()}, torch {torch.__version__} (cuda {torch.version.cuda}), triton {triton.__version__}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"device {p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.1f} GiB")
missing = [m for m in ("starlette", "uvicorn", "watchdog", "gguf", "llguidance", "transformers", "pytest")
           if importlib.util.find_spec(m) is None]
print("absent packages:", ", ".join(missing) or "none")
EOF
}
wheels() {   # --no-deps: never replace the image's torch, triton or numpy
    $PY -c "import gguf, starlette, uvicorn, watchdog, llguidance, pytest" 2>/dev/null && { echo "wheels: all present"; return 0; }
    [[ -d .gpu_wheels ]] || { echo "no .gpu_wheels folder: run playground/gpu_wheels.sh with network first and carry it"; return 3; }
    $PY -m pip install -q --no-index --no-deps --find-links .gpu_wheels \
        $(ls .gpu_wheels | grep -v -e '^numpy' -e '^torch' -e '^triton' | sed 's|^|.gpu_wheels/|') 2>&1 | tail -3
    $PY -c "import gguf, starlette, uvicorn, pytest; print('wheels ok')"
}
big() {   # Llama-3.1-8B's shape, Q4_K, dequantized on the card at load (runtime/torch_dequant.py)
    local md; md=$(mktemp -d); local shape=llama-3.1-8b bs=1,8,32 steps=10
    [[ "$DRY" == 1 ]] && { shape=tiny; bs=1,2; steps=3; }
    local t0; t0=$(date +%s)
    $PY playground/shape_model.py $shape Q4_K "$md/big.gguf" || return 3
    echo "shape model written in $(( $(date +%s) - t0 )) s"
    ls -la "$md"
    $PY playground/gpu_model_bench.py "$md/big.gguf" --device "$DEV" --batches $bs --steps $steps --ctx 1024 \
        --engine-tokens 0 --gpu-weights dense,blocks --budget-s $(( PART_S - 40 )) --out "$OUT_DIR/big"
    local rc=$?; rm -rf "$md"; return $rc
}
export DEV=cuda DRYARG="" OUT_DIR DRY; [[ "$DRY" == 1 ]] && { DEV=cpu; DRYARG=--dry-run; }
missing() { [[ -f "$1" ]] && return 1; echo "$1 is absent: nothing to run"; }
qmatmul() { missing playground/gpu_qmatmul_bench.py && return 0
    [[ "$DRY" == 1 ]] && export TRITON_INTERPRET=1
    local tune=(); [[ "${QMATMUL_TUNE:-0}" == 1 ]] && tune=(--tune 40 --tune-wide-only --tune-shapes "Llama8B gate_up,Llama8B down")
    $PY playground/gpu_qmatmul_bench.py $DRYARG "${tune[@]}" --budget-s 55 --out "$OUT_DIR"; }
launches() { missing playground/decode_launches.py && return 0
    $PY playground/decode_launches.py --device "$DEV" --compare --gemv --out "$OUT_DIR"; }
gemv() { missing playground/gpu_gemv_bench.py && return 0
    $PY playground/gpu_gemv_bench.py $DRYARG --budget-s $(( PART_S - 15 )) --out "$OUT_DIR"; }
gemvab() {   # the fused-GEMV body A/B (--fused-gemv off,on), Qwen2.5-0.5B's shape in BF16 (dense weights)
    local md; md=$(mktemp -d); local shape=qwen2.5-0.5b bs=1,8,16 steps=20
    [[ "$DRY" == 1 ]] && { shape=tiny; bs=1,2; steps=3; }
    $PY playground/shape_model.py $shape BF16 "$md/q.gguf" || return 3
    $PY playground/gpu_model_bench.py "$md/q.gguf" --device "$DEV" --batches $bs --steps $steps \
        --engine-tokens 0 --gpu-weights dense --fused-gemv off,on --budget-s $(( PART_S - 30 )) \
        --out "$OUT_DIR/gemvab"
    local rc=$?; rm -rf "$md"; return $rc; }
qgemvab() {   # Llama-8B's shape in Q4_K: dense bf16 and GGUF blocks with the defaults (qgemv_def), then
    # blocks on the noq8 and old bodies, the wide GEMV alone and the slices alone (the int8 product off)
    local md; md=$(mktemp -d); local shape=llama-3.1-8b bs=1,8 steps=10 rc=0
    [[ "$DRY" == 1 ]] && { shape=tiny; bs=1,2; steps=3; }
    $PY playground/shape_model.py $shape Q4_K "$md/big.gguf" || return 3
    $PY playground/gpu_model_bench.py "$md/big.gguf" --device "$DEV" --batches $bs --steps $steps --ctx 1024 \
        --engine-tokens 0 --gpu-weights dense,blocks --budget-s 50 --out "$OUT_DIR/qgemv_def" || rc=$?
    $PY playground/gpu_model_bench.py "$md/big.gguf" --device "$DEV" --batches $bs --steps $steps --ctx 1024 \
        --engine-tokens 0 --gpu-weights blocks --body noq8,old --budget-s 40 --out "$OUT_DIR/qgemv_body" || rc=$?
    SLOTSERVER_QMMA=off $PY playground/gpu_model_bench.py "$md/big.gguf" --device "$DEV" --batches ${bs#1,} \
        --steps $steps --ctx 1024 --engine-tokens 0 --gpu-weights blocks --budget-s 30 \
        --out "$OUT_DIR/qgemv_wide" || rc=$?
    SLOTSERVER_QGEMV=slices SLOTSERVER_QMMA=off $PY playground/gpu_model_bench.py "$md/big.gguf" --device "$DEV" --batches $bs \
        --steps $steps --ctx 1024 --engine-tokens 0 --gpu-weights blocks --budget-s 30 \
        --out "$OUT_DIR/qgemv_slices" || rc=$?
    rm -f "$md/big.gguf"   # the mix users download: Q6_K output, attn_v and ffn_down in half the layers
    $PY playground/shape_model.py $shape Q4_K_M "$md/q4km.gguf" || return 3
    $PY playground/gpu_model_bench.py "$md/q4km.gguf" --device "$DEV" --batches $bs --steps $steps --ctx 1024 \
        --engine-tokens 0 --gpu-weights dense,blocks --budget-s 50 --out "$OUT_DIR/qgemv_q4km" || rc=$?
    rm -rf "$md"; return $rc; }
qrows() {   # where the int8 product takes over from the wide GEMV: Llama-8B's Q4_K/Q6_K matmuls at 2-8
    # rows, then the 8B Q4_K shape on blocks at b = 1, 2, 4, 8 with the defaults (the int8 product from 3
    # rows of Q4_K, 5 of Q6_K)
    local md; md=$(mktemp -d); local shape=llama-3.1-8b bs=1,2,4,8 rc=0
    [[ "$DRY" == 1 ]] && { shape=tiny; bs=1,4; export TRITON_INTERPRET=1; }
    $PY playground/gpu_qmatmul_bench.py $DRYARG --rows 2,3,4,8 --formats Q4_K,Q6_K --budget-s 35 --out "$OUT_DIR" || rc=$?
    unset TRITON_INTERPRET
    $PY playground/shape_model.py $shape Q4_K "$md/big.gguf" || return 3
    $PY playground/gpu_model_bench.py "$md/big.gguf" --device "$DEV" --batches $bs --steps 10 --ctx 1024 \
        --engine-tokens 0 --gpu-weights blocks --budget-s 30 --out "$OUT_DIR/qrows" || rc=$?
    rm -rf "$md"; return $rc; }
http() {   # the server's host work per streamed token: asyncio against uvloop (and
    # the streams' catch-up coalescing both have), Qwen2.5-0.5B's shape in Q4_K, streamed chat
    local md; md=$(mktemp -d); local shape=qwen2.5-0.5b conc=1,8,64 tokens=64 rounds=2
    [[ "$DRY" == 1 ]] && { shape=tiny; conc=1,4; tokens=8; rounds=1; }
    $PY playground/shape_model.py $shape Q4_K "$md/q.gguf" || return 3
    $PY playground/http_overhead.py -m "$md/q.gguf" --serve-args "--device $DEV" -t 4 --endpoints chat \
        --concurrency $conc --tokens $tokens --rounds $rounds --tree .:SLOTSERVER_LOOP=asyncio --tree . \
        --json "$OUT_DIR/http_overhead.json"
    local rc=$?; rm -rf "$md"; return $rc
}
sampling() { missing playground/gpu_sampling_bench.py && return 0
    $PY playground/gpu_sampling_bench.py --device "$DEV" $DRYARG --budget-s 30; }
part versions 30 versions
part wheels 60 wheels
# the CPU side's C libraries (the tests compare with the CPU) on all the host's cores at once, not one
# by one inside the tests' slice (34 s on 2 cores here; with enough cores, about attention.c's own 8-11 s)
TAIL=5 part build 40 $PY -m slotserver.cli.main lab build
# the newest kernels' card tests first (a part cut by its timeout loses its last files)
# (the sixth round's ran out of its 150 s inside test_device_sampling: the LoRA test now comes before)
TAIL=60 part tests 150 $PY -m pytest -v -rf --tb=short -p no:cacheprovider \
    $(ls tests/test_gpu_*.py tests/test_qmma.py tests/test_gemv*.py 2>/dev/null) \
    tests/test_lora.py::test_on_the_gpu_an_adapter_gives_the_cpus_logits tests/test_device.py \
    $(ls tests/test_torch_dequant.py tests/test_device_*.py 2>/dev/null | grep -v test_device_archs)
# every architecture fixture on the card (the hybrids' recurrences are new since the fourth round)
TAIL=40 part archs 100 $PY -m pytest -v -rf --tb=short -p no:cacheprovider tests/test_device_archs.py
# the prefill tiles (last-first row order, the scale in the exponent, TMA descriptors: sixth round)
PREFILL_SWEEP="64,64,4,3,tma;64,64,4,2;64,64,4,2,tma;128,64,8,2,tma;128,64,8,3,tma;128,128,8,2,tma;64,32,4,2,tma;128,64,8,2;64,128,4,2,tma"
if [[ "$DRY" == 1 ]]; then
    part kernels 60 env TRITON_INTERPRET=1 $PY playground/gpu_kernel_bench.py --dry-run --out "$OUT_DIR" \
        --prefill-tiles "64,64,4,3,tma;64,32,4,2"
else
    TAIL=70 part kernels 130 $PY playground/gpu_kernel_bench.py --budget-s 115 --out "$OUT_DIR" \
        --prefill-tiles "${PREFILL_TILES:-$PREFILL_SWEEP}"
fi
# the GGUF-block decode (the wide GEMV, tuned on an H200 2026-11-27: docs/gpu.md), then reruns
TAIL=30 part qgemvab 200 qgemvab
TAIL=30 part model ${MODEL_PART_S:-120} bash playground/gpu_model_check.sh "$OUT_DIR"
TAIL=60 part launches 50 launches
TAIL=40 part labtime 40 $PY -c "from slotserver.cli.lab import time_kernels; print(time_kernels(None, small=$DRY == 1))"
TAIL=40 part qmatmul 110 qmatmul
TAIL=12 part http 100 http
if [[ "$DRY" == 1 ]]; then
    part hf 60 $PY playground/hf_bench.py --device cpu --tiny --batches 1,2 --steps 4 --out "$OUT_DIR"
    part sweep 60 $PY playground/layout_sweep.py --device cpu --batches 1 2 --contexts 64 --rounds 1 --reps 1 \
        --out "$OUT_DIR/layout_sweep.png"
else
    part hf 60 $PY playground/hf_bench.py --device cuda --batches 1,8,32,64 --steps 32 --budget-s 45 --no-compile --out "$OUT_DIR"
    part sweep 50 $PY playground/layout_sweep.py --device cuda --dtype bfloat16 --batches 1 8 32 64 \
        --contexts 1024 2048 4096 8192 --rounds 2 --reps 20 --out "$OUT_DIR/layout_sweep.png"
fi
TAIL=30 part gemv 60 gemv
TAIL=20 part gemvab 90 gemvab
# earlier rounds' parts, run when named in GPU_CHECK_PARTS
# the tests part's tail alone (the sixth round's tests part ran out of its 150 s in test_device_sampling)
TAIL=40 part tests2 100 $PY -m pytest -v -rf --tb=short -p no:cacheprovider tests/test_device_sampling.py \
    $(ls tests/test_device_async_steps.py tests/test_torch_dequant.py 2>/dev/null) \
    tests/test_lora.py::test_on_the_gpu_an_adapter_gives_the_cpus_logits
TAIL=40 part qrows 100 qrows
TAIL=40 part lab 60 $PY -m slotserver.cli.main lab check --cases 2 --no-aot
ATT_DRY=(); [[ "$DRY" == 1 ]] && ATT_DRY=(--dry-run)
[[ "$DRY" == 1 ]] && export TRITON_INTERPRET=1
part attention 60 $PY playground/gpu_attention_bench.py "${ATT_DRY[@]}" --out "$OUT_DIR" --budget-s 30
TAIL=20 part big 120 big
TAIL=30 part sampling 40 sampling

echo
echo "== short table ($(elapsed) s in all; logs in $OUT_DIR)"
for p in "${!RC[@]}"; do echo "part $p: exit ${RC[$p]}"; done | sort
grep -h -E "passed|failed" "$OUT_DIR/tests.log" "$OUT_DIR/archs.log" 2>/dev/null | grep -E "^=|^[0-9]" | tail -2
grep -h -E "FAILED|ERROR" "$OUT_DIR/tests.log" "$OUT_DIR/archs.log" 2>/dev/null | head -20
[[ -f "$OUT_DIR/model_bench.log" ]] && sed -n '/^copy bandwidth/,$p' "$OUT_DIR/model_bench.log"
grep -h "^concurrency" "$OUT_DIR/model.log" 2>/dev/null
grep -h "^engine async-steps" "$OUT_DIR/model_bench.log" 2>/dev/null
grep -h "^hf b=" "$OUT_DIR/hf.log" 2>/dev/null
grep -h "^engine phases" "$OUT_DIR/model_bench.log" 2>/dev/null
grep -h "^tiles" "$OUT_DIR/kernels.log" 2>/dev/null
sed -n '/^summary/,$p' "$OUT_DIR/kernels.log" 2>/dev/null | head -30
grep -h -E "checks passed|^FAIL" "$OUT_DIR/lab.log" 2>/dev/null | head -6
sed -n '/^timings of/,$p' "$OUT_DIR/labtime.log" 2>/dev/null | head -30
sed -n '/^summary (copy+host/,$p' "$OUT_DIR/sampling.log" 2>/dev/null | head -20
[[ -f "$OUT_DIR/big.log" ]] && grep -h -E "written in|^loaded|^copy bandwidth|^big.gguf" "$OUT_DIR/big.log" | tail -8
sed -n '/^summary/,$p' "$OUT_DIR/attention.log" 2>/dev/null | head -20
sed -n '/^summary/,$p' "$OUT_DIR/http.log" 2>/dev/null | head -10
grep -h -A 10 "^copy bandwidth" "$OUT_DIR/gemvab.log" "$OUT_DIR/qgemvab.log" 2>/dev/null
grep -h " layer " "$OUT_DIR/gemv.log" 2>/dev/null | head -12
grep -h -E "^ +[a-z0-9.-]+ +[a-z_]+ +(Q|MX)[0-9A-Z_]+ +[0-9]+ " "$OUT_DIR/qmatmul.log" 2>/dev/null | head -40
