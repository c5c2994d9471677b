#!/usr/bin/env bash
# One-shot GPU check (issue 34), under 6 minutes on an H100 with cold Triton caches and no network:
#   1. nvidia-smi and versions (python, torch, triton, CUDA; which optional packages the image lacks);
#   1b. playground/gpu_model_check.sh (MODEL_S seconds, default 150): the model served on --device cuda:
#      wheels from .gpu_wheels/ (carry it: playground/gpu_wheels.sh makes it), random-weight Qwen2.5-0.5B
#      shapes, generate, decode tok/s vs the bytes bound, HTTP bench; GPU_CHECK_PARTS=attention skips it;
#   2. `slotserver lab check` restricted to kernels/attention.py and kernels/paged_attention.py (a
#      temporary kernels folder holding those two and attention.c): cpu and Triton (on cuda) numerics
#      against the references, AOT compiles for sm_80/sm_90, layout contracts;
#   3. playground/gpu_attention_bench.py: our decode kernels (seq_head_dim, head_seq_dim, paged,
#      paged_hnd) vs torch SDPA and the copy bandwidth, then a short tuning sweep while time is left;
#   4. a short table last.
# Logs go to OUT_DIR (argument, else $OUT, else ./gpu_out).
#
#   cd <repo root> && PYTHONPATH=. bash playground/gpu_check.sh [OUT_DIR]
#
# Nothing here needs starlette, uvicorn, watchdog, gguf or llguidance (the lab check and the bench
# import only torch, triton and slotserver.runtime). GPU_CHECK_DRY=1 runs the same steps on a
# CPU: the lab check as it is, the bench's --dry-run under TRITON_INTERPRET=1 (tiny shapes).
set -u
T0=$(date +%s)
TOTAL_S=${GPU_CHECK_TOTAL_S:-330}        # everything, with margin under 6 minutes
PARTS=${GPU_CHECK_PARTS:-model,attention}
OUT_DIR="${1:-${OUT:-./gpu_out}}"
mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd)
cd "$(dirname "$0")/.." || exit 1        # the repo root
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python}
DRY=${GPU_CHECK_DRY:-0}
elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( TOTAL_S - $(date +%s) + T0 )); }

echo "== gpu_check: $(date -u +%FT%TZ), repo $(git rev-parse --short HEAD 2>/dev/null || echo '?') (dirty files: $(git status --porcelain 2>/dev/null | wc -l)), out $OUT_DIR"

echo "== nvidia-smi"
{ nvidia-smi && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.memory,power.limit --format=csv; } \
    > "$OUT_DIR/nvidia-smi.txt" 2>&1
cat "$OUT_DIR/nvidia-smi.txt"

echo "== versions"
$PY - <<'EOF' 2>&1 | tee "$OUT_DIR/versions.txt"
import importlib.util, platform, sys
import torch, triton
print(f"python {platform.python_version()}, torch {torch.__version__} (cuda {torch.version.cuda}), triton {triton.__version__}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"device {p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.1f} GiB")
else:
    print("no CUDA device")
def absent(name):
    try:
        return importlib.util.find_spec(name) is None
    except Exception:   # noqa: BLE001 - an import hook refusing it counts as absent
        return True
missing = [m for m in ("starlette", "uvicorn", "watchdog", "gguf", "llguidance", "numpy", "transformers") if absent(m)]
print("absent packages (none of them needed here):", ", ".join(missing) or "none")
EOF

if [[ "$PARTS" == *model* ]]; then
    echo "== model on the device (playground/gpu_model_check.sh)"
    MODEL_S=${MODEL_S:-150} timeout $(( ${MODEL_S:-150} + 20 )) bash playground/gpu_model_check.sh "$OUT_DIR" \
        2>&1 | tee "$OUT_DIR/model_check.log"
fi

echo "== lab check (attention, paged_attention)"
LAB_TMP=$(mktemp -d)
mkdir -p "$LAB_TMP/kernels"
cp kernels/attention.py kernels/paged_attention.py kernels/attention.c "$LAB_TMP/kernels/"
LAB_S=$(( $(left) - 100 )); (( LAB_S > 120 )) && LAB_S=120; (( LAB_S < 40 )) && LAB_S=40
timeout "$LAB_S" $PY -m slotserver.cli.main lab check --kernels-dir "$LAB_TMP/kernels" --cases 3 \
    > "$OUT_DIR/lab_check.txt" 2>&1
LAB_RC=$?
rm -rf "$LAB_TMP"
cat "$OUT_DIR/lab_check.txt"
(( LAB_RC == 124 )) && echo "lab check: stopped by its ${LAB_S} s timeout"
echo "lab check: exit $LAB_RC after $(elapsed) s"

echo "== decode attention bench"
BENCH_S=$(( $(left) - 15 )); (( BENCH_S < 40 )) && BENCH_S=40
BUDGET=$(( BENCH_S - 45 )); (( BUDGET < 20 )) && BUDGET=20   # the bench starts no case after this
if [[ "$DRY" == 1 ]]; then
    TRITON_INTERPRET=1 timeout "$BENCH_S" $PY playground/gpu_attention_bench.py --dry-run --tune --out "$OUT_DIR" \
        --budget-s "$BUDGET" > "$OUT_DIR/attention_bench.log" 2>&1
else
    timeout "$BENCH_S" $PY playground/gpu_attention_bench.py --tune --out "$OUT_DIR" --budget-s "$BUDGET" \
        > "$OUT_DIR/attention_bench.log" 2>&1
fi
BENCH_RC=$?
grep -v -e "UserWarning" -e "warn_once" "$OUT_DIR/attention_bench.log"
(( BENCH_RC == 124 )) && echo "bench: stopped by its ${BENCH_S} s timeout (rows so far are in attention_bench.log)"

echo
echo "== short table ($(elapsed) s in all; logs in $OUT_DIR)"
grep -m1 -E "^device|^device-to-device" "$OUT_DIR/attention_bench.log"
grep -E "checks passed" "$OUT_DIR/lab_check.txt" | sed 's/^/lab check: /' || echo "lab check: no result (exit $LAB_RC)"
grep -E "^FAIL" "$OUT_DIR/lab_check.txt" | head -5
sed -n '/^summary/,$p' "$OUT_DIR/attention_bench.log" | grep -v -e "UserWarning" -e "warn_once"
[[ -f "$OUT_DIR/model_bench.log" ]] && sed -n '/^copy bandwidth/,$p' "$OUT_DIR/model_bench.log"
grep -h "^concurrency" "$OUT_DIR/model_check.log" 2>/dev/null
echo "exit codes: lab check $LAB_RC, bench $BENCH_RC"
