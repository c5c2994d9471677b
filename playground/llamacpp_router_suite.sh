#!/usr/bin/env bash
# llama.cpp's router-mode server tests (tools/server/tests/unit/test_router.py of the llama.cpp
# vendored in the llama-cpp-python 0.3.36 sdist) against slotserver AND the real llama-server, same
# model mapping. Run from the project root:   playground/llamacpp_router_suite.sh [pytest args]
# The tests start a router with no model and expect three hub models in llama.cpp's cache; there
# is no network, so a Hugging Face hub cache is built here with symlinks:
#   ggml-org/tinygemma3-GGUF:Q8_0                 -> $SUITE_MODELS/gemma/model.gguf (gemma-3-270m)
#   ggml-org/test-model-stories260K:F32           -> the default model (SmolLM2-135M-Instruct Q4_1)
#   ggml-org/test-model-stories260K-infill:F32    -> the default model
# and both servers read it (LLAMA_CACHE for llama-server, --models-cache for slotserver).
# Not portable (need the network): test_router_remote_preset, test_router_download_model,
# test_router_delete_model (hub downloads); they are deselected. Prints one line per test:
# slotserver's result, llama-server's (pytest outputs in playground/out/llamacpp_router_suite/;
# ROUTER_SUITE_SERVERS=slotserver runs one of the two).
# The tests and their venv: playground/llamacpp_tests_tree.sh (made on first use).
set -u
root=$PWD
cache=${XDG_CACHE_HOME:-$HOME/.cache}
source "$root/playground/llamacpp_tests_tree.sh"   # $tree, $venv
peer=${LLAMA_CPP_DIR:-$cache/slotserver-peer/llama_cpp_python-0.3.36/vendor/llama.cpp}/build/bin/llama-server
models=${SUITE_MODELS:-$cache/slotserver-models}
export SUITE_MODEL=${SUITE_MODEL:-$("$root/.venv/bin/python" -c \
  "from slotserver.model.default_model import default_model_path as d; print(d())")}
for f in "$tree/tools/server/tests/unit/test_router.py" "$venv/bin/python" "$SUITE_MODEL" \
         "$models/gemma/model.gguf" "$root/.venv/bin/slotserver"; do
  [[ -e $f ]] || { echo "missing: $f"; exit 1; }
done
work=$(mktemp -d /tmp/llamacpp-router-suite.XXXXXX)
trap 'rm -rf "$work"' EXIT
cp -r "$tree/tools/server/tests" "$work/tests"
mkdir -p "$work/tests/tmp"   # the tests' TMP_DIR (llama.cpp's load_all makes it while downloading)
"$venv/bin/python" - "$work/tests" <<'PY'
import sys
p = f"{sys.argv[1]}/conftest.py"; s = open(p).read()
s = s.replace("        ServerPreset.load_all()", "        pass  # models are local (the hub cache built here)")
open(p, "w").write(s)
PY
hub=$work/hub
commit=0123456789abcdef0123456789abcdef01234567
add() {  # repo file target
  local d=$hub/models--${1//\//--}
  mkdir -p "$d/refs" "$d/snapshots/$commit"
  echo $commit >"$d/refs/main"
  ln -s "$3" "$d/snapshots/$commit/$2"
}
add ggml-org/tinygemma3-GGUF tinygemma3-Q8_0.gguf "$models/gemma/model.gguf"
add ggml-org/test-model-stories260K stories260K-F32.gguf "$SUITE_MODEL"
add ggml-org/test-model-stories260K-infill stories260K-infill-F32.gguf "$SUITE_MODEL"
# the shim: slotserver reads the same cache through --models-cache when started without a model
cat >"$work/shim" <<'SH'
#!/usr/bin/env bash
args=(); router=1
for a in "$@"; do case $a in --model|-m|--hf-repo) router=0 ;; esac; done
while [[ $# -gt 0 ]]; do
  case $1 in --offline) shift; continue ;; esac
  args+=("$1"); shift
done
if [[ $SUITE_WHO == llama-server ]]; then exec "$SUITE_BIN" "${args[@]}"; fi
[[ $router == 1 ]] && args+=(--models-cache "$LLAMA_CACHE")
exec "$SUITE_BIN" serve "${args[@]}"
SH
chmod +x "$work/shim"
skip="not test_router_remote_preset and not test_router_download_model and not test_router_delete_model"
run() {  # who bin
  echo "== $1: $2"
  local port
  port=$("$venv/bin/python" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  (cd "$work/tests" && PORT=$port SUITE_WHO=$1 SUITE_BIN=$2 LLAMA_CACHE=$hub LLAMA_SERVER_BIN_PATH=$work/shim \
    "$venv/bin/python" -m pytest -q -rA -p no:cacheprovider unit/test_router.py -k "$skip" "${@:3}" \
    >"$work/$1.txt" 2>&1)
  tail -1 "$work/$1.txt"
}
out=${ROUTER_SUITE_OUT:-playground/out/llamacpp_router_suite}
mkdir -p "$out"
for who in ${ROUTER_SUITE_SERVERS:-slotserver llama-server}; do
  case $who in
    slotserver) run slotserver "$root/.venv/bin/slotserver" "$@" ;;
    llama-server) [[ -x $peer ]] || { echo "no llama-server at $peer"; continue; }; run llama-server "$peer" "$@" ;;
    *) echo "ROUTER_SUITE_SERVERS: slotserver and/or llama-server"; exit 1 ;;
  esac
  cp "$work/$who.txt" "$out/"
done
"$venv/bin/python" - "$out/slotserver.txt" "$out/llama-server.txt" <<'PY'
import os, re, sys
res = []
for path in sys.argv[1:]:
    d = {}
    for line in (open(path) if os.path.exists(path) else ()):
        m = re.match(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)", line)
        if m:
            d[m.group(2).split("::", 1)[-1]] = m.group(1)
    res.append(d)
print(f"\n{'test':<56} {'slotserver':>10} {'llama-server':>12}")
for t in sorted(set(res[0]) | set(res[1])):
    print(f"{t:<56} {res[0].get(t, '-'):>10} {res[1].get(t, '-'):>12}")
PY
echo "(pytest output: $out/slotserver.txt, $out/llama-server.txt)"
