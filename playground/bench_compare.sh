#!/usr/bin/env bash
# Side-by-side: slotserver and llama-server on this machine, same model, same prompts, same
# `slotserver bench` client, at concurrency 1, 8 and 32. Both servers stay up (an idle one costs
# nothing) and the runs alternate, slotserver then llama-server at each concurrency, for ROUNDS
# rounds, so a slow spell of this noisy machine hits both alike; the table shows the median of
# the rounds and every round's throughput ratio. Each (round, concurrency) has its own prompt seed,
# and both servers get the same prompts: no prompt is ever seen twice by a server's prompt cache.
# Usage: [ROUNDS=2] [MODEL=f.gguf] [SLOT_FLAGS=...] [BENCH_FLAGS=...] playground/bench_compare.sh /path/to/llama-server [outdir]
set -euo pipefail
LLAMA_SERVER=${1:?path to llama-server (see docs/performance.md to build it)}
OUT=${2:-playground/out/bench}
ROUNDS=${ROUNDS:-2}
MODEL=${MODEL:-$(.venv/bin/python -c "from slotserver.model.default_model import default_model_path as p; print(p())")}
SLOT_FLAGS=${SLOT_FLAGS:-}   # e.g. SLOT_FLAGS="--weights q" to compare another weight format
BENCH_FLAGS=${BENCH_FLAGS:-}   # e.g. BENCH_FLAGS="--temperature 0.8": llama-server's default chain (default: greedy)
mkdir -p "$OUT"
wait_up() { for _ in $(seq 600); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 0.5; done; return 1; }
bench() {  # name port concurrency round
  local n=$(( $3 == 1 ? 8 : ($3 == 8 ? 32 : 64) ))
  .venv/bin/slotserver bench --base-url "http://127.0.0.1:$2" --backend openai --input-len 128 --output-len 64 \
    --num-prompts "$n" --max-concurrency "$3" --warmup 2 --seed "$(( 100 * $4 + $3 ))" --no-progress --json "$OUT/$1-c$3-r$4.json" $BENCH_FLAGS > "$OUT/$1-c$3-r$4.txt"
}
.venv/bin/slotserver serve -m "$MODEL" --port 8091 -np 32 -c 8192 -t 2 --no-watch $SLOT_FLAGS > "$OUT/slotserver.log" 2>&1 &
SLOT=$!
"$LLAMA_SERVER" -m "$MODEL" --port 8092 -np 32 -c 8192 -t 2 > "$OUT/llama-server.log" 2>&1 &
LLAMA=$!
trap 'kill $SLOT $LLAMA 2>/dev/null || true; wait $SLOT $LLAMA 2>/dev/null || true' EXIT   # wait: the ports are free for the next run
wait_up 8091; wait_up 8092
for r in $(seq "$ROUNDS"); do
  for c in 1 8 32; do bench slotserver 8091 "$c" "$r"; bench llama-server 8092 "$c" "$r"; done
done
.venv/bin/python - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
load = lambda n, c, r: json.load(open(f"{out}/{n}-c{c}-r{r}.json"))
print(f"median of {rounds} alternating round(s)")
print(f"{'concurrency':>11} {'metric':>24} {'slotserver':>11} {'llama-server':>13} {'ratio':>6}")
for c in (1, 8, 32):
    runs = [(load("slotserver", c, r), load("llama-server", c, r)) for r in range(1, rounds + 1)]
    for key, label, better in (("output_throughput", "output tok/s", 1), ("total_token_throughput", "total tok/s", 1),
                               ("median_ttft_ms", "median TTFT ms", -1), ("median_tpot_ms", "median TPOT ms", -1)):
        x, y = (statistics.median(run[i][key] for run in runs) for i in (0, 1))
        print(f"{c:>11} {label:>24} {x:11.1f} {y:13.1f} {(x / y if better > 0 else y / x):6.2f}")
    failed = [sum(run[i]["failed"] for run in runs) for i in (0, 1)]
    per_round = " ".join(f"{a['output_throughput'] / b['output_throughput']:.2f}" for a, b in runs)
    print(f"{'':>11} {'failed':>24} {failed[0]:11d} {failed[1]:13d}   output ratio per round: {per_round}")
PY
