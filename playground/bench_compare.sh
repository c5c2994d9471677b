#!/usr/bin/env bash
# Side-by-side: slotserver and llama-server on this machine, same model, same prompts, same
# `slotserver bench` client, at concurrency 1, 8 and 32 (one server at a time, so they never
# compete for the 2 cores). Usage: playground/bench_compare.sh /path/to/llama-server [outdir]
set -euo pipefail
LLAMA_SERVER=${1:?path to llama-server (see docs/performance.md to build it)}
OUT=${2:-playground/out/bench}
MODEL=$(.venv/bin/python -c "from slotserver.default_model import default_model_path as p; print(p())")
mkdir -p "$OUT"
wait_up() { for _ in $(seq 600); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 0.5; done; return 1; }
run_bench() {  # name port
  for c in 1 8 32; do
    n=$(( c == 1 ? 8 : (c == 8 ? 32 : 64) ))
    .venv/bin/slotserver bench --base-url "http://127.0.0.1:$2" --backend openai --input-len 128 --output-len 64 \
      --num-prompts "$n" --max-concurrency "$c" --warmup 2 --no-progress --json "$OUT/$1-c$c.json" > "$OUT/$1-c$c.txt"
  done
}
.venv/bin/slotserver serve -m "$MODEL" --port 8091 -np 32 -c 8192 -t 2 --no-watch > "$OUT/slotserver.log" 2>&1 &
PID=$!; wait_up 8091; run_bench slotserver 8091; kill $PID; wait $PID 2>/dev/null || true
"$LLAMA_SERVER" -m "$MODEL" --port 8092 -np 32 -c 8192 -t 2 > "$OUT/llama-server.log" 2>&1 &
PID=$!; wait_up 8092; run_bench llama-server 8092; kill $PID; wait $PID 2>/dev/null || true
.venv/bin/python - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
print(f"{'concurrency':>11} {'metric':>24} {'slotserver':>11} {'llama-server':>13} {'ratio':>6}")
for c in (1, 8, 32):
    a, b = (json.load(open(f"{out}/{n}-c{c}.json")) for n in ("slotserver", "llama-server"))
    for key, label, better in (("output_throughput", "output tok/s", 1), ("total_token_throughput", "total tok/s", 1),
                               ("median_ttft_ms", "median TTFT ms", -1), ("median_tpot_ms", "median TPOT ms", -1)):
        x, y = a[key], b[key]
        ratio = (x / y) if better > 0 else (y / x)
        print(f"{c:>11} {label:>24} {x:11.1f} {y:13.1f} {ratio:6.2f}")
    print(f"{'':>11} {'failed':>24} {a['failed']:11d} {b['failed']:13d}")
PY
