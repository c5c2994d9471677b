#!/usr/bin/env bash
# The model half of the GPU check (issue 34): slotserver serving on `--device cuda`.
#   1. installs the wheels the GPU image lacks (gguf, starlette, uvicorn, watchdog, llguidance...) from
#      .gpu_wheels/ (made beforehand, with network, by playground/gpu_wheels.sh; carried with the run);
#   2. writes random-weight GGUFs of Qwen2.5-0.5B's shape (MODEL_FORMATS, default Q4_K; BF16 and Q8_0
#      were timed in earlier rounds; playground/shape_model.py);
#   3. `slotserver generate --device cuda`: loads and answers (a smoke test);
#   4. playground/gpu_model_bench.py: decode ms/step and tok/s at b=1/8/32/64 vs the bytes bound, with
#      the weights dense (bf16, cuBLAS) and as GGUF blocks (Triton), and the whole engine's tok/s with
#      overlapped steps off and on (the A/B);
#   5. HTTP: `slotserver serve --device cuda` + `slotserver bench` at concurrency 1/8/32/64 (async steps
#      on, the default), then concurrency 1 again with `--async-steps off`.
# Each part has its own timeout inside MODEL_S seconds (default 170). Logs go to OUT_DIR.
#   PYTHONPATH=. bash playground/gpu_model_check.sh OUT_DIR         (gpu_check.sh calls it first)
# GPU_CHECK_DRY=1: the same steps on a CPU with a tiny shape and --device cpu (a few minutes on 2 cores).
set -u
T0=$(date +%s)
OUT_DIR="${1:-${OUT:-./gpu_out}}"
mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd)
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python}
MODEL_S=${PART_S:-${MODEL_S:-170}}   # gpu_check.sh gives its slice as PART_S
left() { echo $(( MODEL_S - $(date +%s) + T0 )); }
if [[ "${GPU_CHECK_DRY:-0}" == 1 ]]; then
    DEV=cpu; SHAPE=tiny; BATCHES=1,4; STEPS=3; CONC="1 4"; NP=4
else
    DEV=cuda; SHAPE=qwen2.5-0.5b; BATCHES=1,8,32,64; STEPS=20; CONC="1 8 32 64"; NP=64
fi
SS="$PY -m slotserver.cli.main"

echo "== wheels"
if ! $PY -c "import gguf, starlette, uvicorn, watchdog, llguidance" 2>/dev/null; then
    if [[ -d .gpu_wheels ]]; then   # --no-deps: never replace the image's torch or numpy
        $PY -m pip install -q --no-index --no-deps --find-links .gpu_wheels \
            $(ls .gpu_wheels | grep -v -e '^numpy' -e '^torch' -e '^triton' | sed 's|^|.gpu_wheels/|') 2>&1 | tail -3
    else
        echo "no .gpu_wheels folder: run playground/gpu_wheels.sh with network first and carry it"
    fi
fi
$PY -c "import gguf, starlette, uvicorn; print('wheels ok: gguf', gguf.__version__ if hasattr(gguf, '__version__') else '')" \
    || { echo "model check skipped: packages missing"; exit 3; }

echo "== shape models ($SHAPE)"
MD=$(mktemp -d)
for q in ${MODEL_FORMATS:-Q4_K}; do
    timeout 60 $PY playground/shape_model.py "$SHAPE" "$q" "$MD/$SHAPE-$q.gguf" || echo "shape model $q failed"
done
ls -la "$MD"

echo "== generate --device $DEV"
timeout 90 $SS generate -m "$MD/$SHAPE-Q4_K.gguf" --device "$DEV" -n 16 --temp 0 "Hello" \
    > "$OUT_DIR/generate.log" 2>&1
echo "generate: exit $?"; tail -5 "$OUT_DIR/generate.log"

echo "== model bench"
BS=$(( $(left) - 75 )); (( BS < 30 )) && BS=30
timeout "$BS" $PY playground/gpu_model_bench.py $(ls "$MD"/*.gguf) --device "$DEV" --gpu-weights dense,blocks \
    --async-steps off,on --batches "$BATCHES" --steps "$STEPS" --budget-s $(( BS - 15 )) --out "$OUT_DIR" \
    > "$OUT_DIR/model_bench.log" 2>&1
echo "model bench: exit $?"; grep -v -e Warning -e warn "$OUT_DIR/model_bench.log" | tail -12

warm_up() {   # a short discarded run at two concurrencies
    for c in 1 8; do
        timeout 30 $SS bench --base-url http://127.0.0.1:8099 --input-len 128 --output-len 16 --num-prompts 8 \
            --max-concurrency $c --no-progress > /dev/null 2>&1
    done
}
echo "== HTTP bench"
HS=$(( $(left) - 5 ))
if (( HS > 20 )); then
    $SS serve -m "$MD/$SHAPE-Q4_K.gguf" --device "$DEV" --port 8099 -np 64 -c 65536 --no-watch \
        > "$OUT_DIR/serve.log" 2>&1 &
    SRV=$!
    for _ in $(seq 60); do curl -sf localhost:8099/health >/dev/null 2>&1 && break; sleep 1; done
    warm_up   # Triton compiles and CUDA-graph captures happen here, not in the first measured run
    for c in $CONC; do
        (( $(left) < 10 )) && break
        timeout "$(( $(left) - 5 ))" $SS bench --base-url http://127.0.0.1:8099 --input-len 128 --output-len 64 \
            --num-prompts "$NP" --max-concurrency "$c" --no-progress --json "$OUT_DIR/http_c$c.json" \
            > "$OUT_DIR/http_c$c.log" 2>&1
        echo "concurrency $c: $(grep -i -m2 -e 'output token throughput' -e 'tok/s' "$OUT_DIR/http_c$c.log" | tr '\n' ' ')"
    done
    kill "$SRV" 2>/dev/null; wait "$SRV" 2>/dev/null
fi
if (( $(left) > 30 )); then   # the baseline of overlapped steps, over HTTP: concurrency 1, --async-steps off
    $SS serve -m "$MD/$SHAPE-Q4_K.gguf" --device "$DEV" --port 8099 -np 64 -c 65536 --no-watch --async-steps off \
        > "$OUT_DIR/serve_sync.log" 2>&1 &
    SRV=$!
    for _ in $(seq 60); do curl -sf localhost:8099/health >/dev/null 2>&1 && break; sleep 1; done
    warm_up
    timeout "$(( $(left) - 5 ))" $SS bench --base-url http://127.0.0.1:8099 --input-len 128 --output-len 64 \
        --num-prompts 16 --max-concurrency 1 --no-progress --json "$OUT_DIR/http_c1_sync.json" \
        > "$OUT_DIR/http_c1_sync.log" 2>&1
    echo "concurrency 1, --async-steps off: $(grep -i -m2 -e 'output token throughput' -e 'tok/s' "$OUT_DIR/http_c1_sync.log" | tr '\n' ' ')"
    kill "$SRV" 2>/dev/null; wait "$SRV" 2>/dev/null
fi
rm -rf "$MD"
echo "model check: $(( $(date +%s) - T0 )) s"
