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

.PHONY: install test demo bench lint clean

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

# The main job: KPO on the embedded long-response task (128-token responses; the warm start is built and cached
# on first use), then the warm start and the trained model evaluated on the same 256 held-out problems, and
# summary.json with 95% intervals. About 6 minutes on 2 CPU cores. DEMO_ARGS adds `kpo train` flags, e.g.
# make demo DEMO_ARGS="--loss vanilla".
DEMO_DIR ?= runs/demo
DEMO_ARGS ?= --loss kpo --loss-kwargs memory=matched
DEMO_EVAL := --data synthetic --n 4 --k 1,4 --batch-size 128
demo: $(STAMP)
	$(VENV)/bin/kpo train --output-dir $(DEMO_DIR) --overwrite --max-steps 60 --prompts-per-step 16 \
		--dump-ratios-every 10 --num-threads 2 --report-to none $(DEMO_ARGS)
	$(VENV)/bin/kpo eval --model $(DEMO_DIR)/warm_start $(DEMO_EVAL) --output $(DEMO_DIR)/eval_warm_start.json
	$(VENV)/bin/kpo eval --model $(DEMO_DIR)/final $(DEMO_EVAL) --output $(DEMO_DIR)/eval.json
	$(VENV)/bin/kpo summary $(DEMO_DIR)
	@echo
	@echo "summary:          $(DEMO_DIR)/summary.json"
	@echo "training metrics: $(DEMO_DIR)/metrics.jsonl"
	@echo "training plot:    $(DEMO_DIR)/training_dynamics.png"
	@echo "eval reports:     $(DEMO_DIR)/eval_warm_start.md, $(DEMO_DIR)/eval.md"
	@echo "ratio dumps:      $(DEMO_DIR)/ratios/ (kpo analyze $(DEMO_DIR))"

bench: $(STAMP)
	$(VENV)/bin/kpo bench filter

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
