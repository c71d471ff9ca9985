# Set-up and entry points. `make test` and `make demo` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kpo-installed

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install test demo lint clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# torch first (a pinned CPU wheel; an unpinned torch would pull a multi-GB CUDA build), then the project.
$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

# verl 0.9.1 without its GPU stack, for tests/integrations (~35 s into .venv; see the script header).
VERL_STAMP := $(VENV)/.kpo-verl-installed
$(VERL_STAMP): $(STAMP) scripts/install_verl_cpu.sh
	scripts/install_verl_cpu.sh $(VENV)
	touch $(VERL_STAMP)

install: $(STAMP) $(VERL_STAMP)

test: $(STAMP) $(VERL_STAMP)
	$(PY) -m pytest -q tests

demo: $(STAMP)
	$(VENV)/bin/kpo bench filter

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
