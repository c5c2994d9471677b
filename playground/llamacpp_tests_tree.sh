# Sourced by playground/llamacpp_*_suite.sh: llama.cpp's server tests (tools/server/tests of the
# llama.cpp vendored in the llama-cpp-python 0.3.36 sdist, the version the peer is built from) and a
# venv to run them, both under ~/.cache/slotserver-suite, made here on first use. Sets $tree and $venv.
# Needs pip to reach PyPI (or its mirror) the first time only.
suite_cache=${XDG_CACHE_HOME:-$HOME/.cache}/slotserver-suite
tree=$suite_cache/llama_cpp_python-0.3.36/vendor/llama.cpp
venv=$suite_cache/venv
if [[ ! -d $tree/tools/server/tests ]]; then
  mkdir -p "$suite_cache"
  (cd "$suite_cache" && python3 -m pip download -q --no-deps --no-binary :all: -d dl llama-cpp-python==0.3.36 \
    && tar xzf dl/llama_cpp_python-0.3.36.tar.gz) || { echo "could not fetch the llama-cpp-python 0.3.36 sdist"; exit 1; }
fi
if [[ ! -x $venv/bin/python ]]; then
  { python3 -m venv "$venv" && "$venv/bin/pip" install -q pytest requests openai wget filelock; } \
    || { echo "could not set up the llama.cpp tests' venv in $venv"; exit 1; }
fi
