#!/usr/bin/env bash
# llama.cpp's own speculative-decoding server tests (tools/server/tests/unit/test_speculative.py of
# the llama.cpp vendored in the llama-cpp-python 0.3.36 sdist) against slotserver AND against the
# real llama-server, same model mapping, so that a test llama-server itself fails here is not
# counted against slotserver. Run from the project root:
#     playground/llamacpp_spec_suite.sh [pytest args, e.g. -k synth]
# The tests want a hub model (stories15M MoE F16) and a hub draft model (stories15M q4_0); there is
# no network, so both are the default model (SmolLM2-135M-Instruct Q4_1): the shim drops the hub
# options and passes -m, and download_file() is patched to return the same file (the default model
# serves as its own draft). Prints one line per test: slotserver's result, llama-server's (the
# pytest outputs stay in playground/out/llamacpp_spec_suite/; SPEC_SUITE_SERVERS=llama-server runs
# one of the two, the table then shows the other's last result).
# Needs the llama.cpp peer (playground/local_server.py); the tests and their venv:
# playground/llamacpp_tests_tree.sh (made on first use).
set -u
root=$PWD
cache=${XDG_CACHE_HOME:-$HOME/.cache}
source "$root/playground/llamacpp_tests_tree.sh"   # $tree, $venv
peer=${LLAMA_CPP_DIR:-$cache/slotserver-peer/llama_cpp_python-0.3.36/vendor/llama.cpp}/build/bin/llama-server
export SUITE_MODEL=${SUITE_MODEL:-$("$root/.venv/bin/python" -c \
  "from slotserver.model.default_model import default_model_path as d; print(d())")}
for f in "$tree/tools/server/tests/unit/test_speculative.py" "$venv/bin/python" "$peer" "$SUITE_MODEL" \
         "$root/.venv/bin/slotserver"; do
  [[ -e $f ]] || { echo "missing: $f"; exit 1; }
done
work=$(mktemp -d /tmp/llamacpp-spec-suite.XXXXXX)
trap 'rm -rf "$work"' EXIT
cp -r "$tree/tools/server/tests" "$work/tests"
# no hub: presets are not downloaded, download_file() is the local model
"$venv/bin/python" - "$work/tests" <<'PY'
import os, sys
d = sys.argv[1]
p = f"{d}/conftest.py"; s = open(p).read()
s = s.replace("        ServerPreset.load_all()", "        pass  # models are local (shim)")
open(p, "w").write(s)
p = f"{d}/utils.py"; s = open(p).read()
sig = "def download_file(url: str, output_file_path: str | None = None) -> str:\n"
assert sig in s, "utils.py: download_file not found"
s = s.replace(sig, sig + "    return os.environ['SUITE_MODEL']  # no network: the local default model\n")
# a loaded 2-core machine starts a server (two models, warm-up) in more than the tests' 60 s
s = s.replace("DEFAULT_HTTP_TIMEOUT = 60", f"DEFAULT_HTTP_TIMEOUT = {os.environ.get('SPEC_SUITE_START_S', '300')}")
open(p, "w").write(s)
PY
# the shim: drops the hub options, serves $SUITE_MODEL with $SUITE_BIN ($SUITE_SUB: a subcommand)
cat >"$work/shim" <<'SH'
#!/usr/bin/env bash
args=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --hf-repo|--hf-file) shift 2; continue ;;
    --offline) shift; continue ;;
  esac
  args+=("$1"); shift
done
exec "$SUITE_BIN" $SUITE_SUB -m "$SUITE_MODEL" "${args[@]}"
SH
chmod +x "$work/shim"
run() {  # name bin subcommand -> $work/name.txt (pytest -rA summary)
  echo "== $1: $2 $3"
  # a free port: the tests' default 8080 may be another session's server (its answers would count)
  local port
  port=$("$venv/bin/python" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  (cd "$work/tests" && PORT=$port SUITE_BIN=$2 SUITE_SUB=$3 LLAMA_SERVER_BIN_PATH=$work/shim \
    "$venv/bin/python" -m pytest -q -rA -p no:cacheprovider unit/test_speculative.py "${@:4}" >"$work/$1.txt" 2>&1)
  tail -1 "$work/$1.txt"
}
out=${SPEC_SUITE_OUT:-playground/out/llamacpp_spec_suite}
mkdir -p "$out"
for who in ${SPEC_SUITE_SERVERS:-slotserver llama-server}; do   # SPEC_SUITE_SERVERS=llama-server: that one only
  case $who in
    slotserver) run slotserver "$root/.venv/bin/slotserver" serve "$@" ;;
    llama-server) run llama-server "$peer" "" "$@" ;;
    *) echo "SPEC_SUITE_SERVERS: slotserver and/or llama-server"; exit 1 ;;
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
print(f"\n{'test':<44} {'slotserver':>10} {'llama-server':>12}")
for t in sorted(set(res[0]) | set(res[1])):
    print(f"{t:<44} {res[0].get(t, '-'):>10} {res[1].get(t, '-'):>12}")
PY
echo "(pytest output: $out/slotserver.txt, $out/llama-server.txt)"
